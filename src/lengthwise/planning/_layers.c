/* The layers of the bucket-edge DP (lengthwise.planning.edges), compiled.
 *
 * The same divide and conquer as edges._layer, one j at a time: the j of each window
 * searches i between the arg-mins of its solved neighbours (capped at reach[j]), the
 * cost of a split is (cum[j] - cum[i]) * w[j] + prev[i] in that order of operations,
 * and ties go to the smallest i, so every layer's costs and arg-mins equal the NumPy
 * ones bit for bit (built with floating-point contraction off).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    const double *cum, *w, *prev;
    const int64_t *reach;
    double *out;
    int64_t *arg;
} Layer;

static void solve_window(const Layer *L, int64_t jlo, int64_t jhi, int64_t olo, int64_t ohi)
{
    while (jlo <= jhi) {
        int64_t mid = (jlo + jhi) >> 1;
        int64_t hi = mid - 1;
        if (L->reach != NULL && L->reach[mid] < hi)
            hi = L->reach[mid];
        if (ohi < hi)
            hi = ohi;
        double best = INFINITY;
        int64_t at = olo;
        if (hi >= olo) {
            const double cj = L->cum[mid], wj = L->w[mid];
            best = (cj - L->cum[olo]) * wj + L->prev[olo];
            for (int64_t i = olo + 1; i <= hi; i++) {
                double v = (cj - L->cum[i]) * wj + L->prev[i];
                if (v < best) {
                    best = v;
                    at = i;
                }
            }
        }
        L->out[mid] = best;
        L->arg[mid] = at;
        solve_window(L, jlo, mid - 1, olo, at); /* the left half recurses ... */
        jlo = mid + 1;                           /* ... the right half loops */
        olo = at;
    }
}

static int want(Py_buffer *b, Py_ssize_t items, Py_ssize_t itemsize, const char *name)
{
    if (b->len != items * itemsize || b->itemsize != itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd items of %zd bytes", name, items,
                     itemsize);
        return 0;
    }
    return 1;
}

/* layers(cum, w, reach_or_None, max_k, totals, args) -> layers computed
 *
 * cum, w: float64[U+1]; reach: int64[U+1] or None; totals: float64[max_k] (written);
 * args: int64[max_k * (U+1)] (written, C order). Stops after the first layer equal to the
 * one before it; the caller repeats that layer for the rest. */
static PyObject *layers(PyObject *self, PyObject *a)
{
    Py_buffer cum, w, reach, totals, args;
    PyObject *reach_obj;
    Py_ssize_t max_k;
    PyObject *result = NULL;
    double *tables = NULL;
    int have_reach = 0;
    memset(&reach, 0, sizeof reach);
    if (!PyArg_ParseTuple(a, "y*y*Onw*w*", &cum, &w, &reach_obj, &max_k, &totals, &args))
        return NULL;
    Py_ssize_t n = cum.len / (Py_ssize_t)sizeof(double); /* U + 1 */
    if (reach_obj != Py_None) {
        if (PyObject_GetBuffer(reach_obj, &reach, PyBUF_SIMPLE | PyBUF_FORMAT) < 0)
            goto done;
        have_reach = 1;
        reach.itemsize = (Py_ssize_t)sizeof(int64_t);
        if (!want(&reach, n, sizeof(int64_t), "reach"))
            goto done;
    }
    cum.itemsize = w.itemsize = totals.itemsize = (Py_ssize_t)sizeof(double);
    args.itemsize = (Py_ssize_t)sizeof(int64_t);
    if (n < 2 || max_k < 1 || !want(&cum, n, sizeof(double), "cum")
        || !want(&w, n, sizeof(double), "w")
        || !want(&totals, max_k, sizeof(double), "totals")
        || !want(&args, max_k * n, sizeof(int64_t), "args")) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "need U >= 1 distinct lengths and max_k >= 1");
        goto done;
    }
    tables = PyMem_Malloc(2 * (size_t)n * sizeof(double));
    if (tables == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    double *prev = tables, *cur = tables + n;
    const int64_t u = n - 1;
    Py_ssize_t k = 0;
    Py_BEGIN_ALLOW_THREADS
    for (int64_t j = 0; j < n; j++)
        prev[j] = INFINITY;
    prev[0] = 0.0;
    for (k = 0; k < max_k; k++) {
        int64_t *arg = (int64_t *)args.buf + k * n;
        Layer L = {(const double *)cum.buf, (const double *)w.buf, prev,
                   have_reach ? (const int64_t *)reach.buf : NULL, cur, arg};
        arg[0] = 0;
        solve_window(&L, 1, u, 0, u - 1);
        cur[0] = 0.0; /* fewer buckets than layers: an empty prefix stays free */
        ((double *)totals.buf)[k] = cur[u];
        int same = 1;
        for (int64_t j = 0; j < n && same; j++)
            same = cur[j] == prev[j];
        double *t = prev;
        prev = cur;
        cur = t;
        if (same) {
            k++;
            break;
        }
    }
    Py_END_ALLOW_THREADS
    result = PyLong_FromSsize_t(k);
done:
    PyMem_Free(tables);
    if (have_reach)
        PyBuffer_Release(&reach);
    PyBuffer_Release(&cum);
    PyBuffer_Release(&w);
    PyBuffer_Release(&totals);
    PyBuffer_Release(&args);
    return result;
}

static PyMethodDef methods[] = {
    {"layers", layers, METH_VARARGS, "The bucket-edge DP's layers (see edges.solve)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_layers", NULL, -1, methods};

PyMODINIT_FUNC PyInit__layers(void) { return PyModule_Create(&module); }
