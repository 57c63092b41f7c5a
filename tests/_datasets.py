"""Small data sets shared by the tests."""

from torch.utils.data import Dataset


class IndexDataset(Dataset):
    """Row i is its own index (so batches show which samples were loaded)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i
