/* tidal — choosing the device a model's forward runs on (td_model_set_device, model.h).
 * The CUDA backend is linked in when the build found nvcc (TD_HAVE_CUDA, Makefile); without
 * it "cuda" is still a known name, and asking for it says how to get it. */
#include "../model/ops.h"
#include "tidal/memplan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TD_HAVE_CUDA
const td_backend *td_cuda_backend_open(int index, char *desc, size_t desc_len, td_error *err);
const char *td_cuda_backend_desc(void);
int td_cuda_mem_info(size_t *free_bytes, size_t *total_bytes);
size_t td_cuda_mem_peak(void);
size_t td_cuda_d2h_bytes(void);
#endif

/* "cpu" -> 0 with *index -1; "cuda" / "cuda:N" -> 0 with *index N (0 for "cuda"); else -1. */
static int parse_device(const char *d, int *index)
{
    if (!d) return -1;
    if (!strcmp(d, "cpu")) { *index = -1; return 0; }
    if (strncmp(d, "cuda", 4)) return -1;
    if (d[4] == '\0') { *index = 0; return 0; }
    if (d[4] != ':' || d[5] < '0' || d[5] > '9') return -1;
    char *end;
    long v = strtol(d + 5, &end, 10);
    if (*end || v > 1024) return -1;
    *index = (int)v;
    return 0;
}

int td_device_name_ok(const char *device)
{
    int i;
    return parse_device(device, &i) == 0;
}

int td_opt_device(void *dest, const char *value, char *why, size_t whylen)
{
    (void)why; (void)whylen;
    if (!td_device_name_ok(value)) return -1;   /* the table's `expect` says what is wanted */
    *(const char **)dest = value;
    return 0;
}

int td_model_set_device(td_model *m, const char *device, td_error *err)
{
    int index;
    if (parse_device(device, &index))
        return td_fail(err, "unknown device '%s' (expected cpu, cuda or cuda:N)", device ? device : "");
    if (index < 0) {
        m->backend = NULL;
        return 0;
    }
#ifdef TD_HAVE_CUDA
    const td_backend *be = td_cuda_backend_open(index, NULL, 0, err);
    if (!be) return -1;
    m->backend = be;
    return 0;
#else
    return td_fail(err, "--device %s: this tidal was built without CUDA (nvcc was not on PATH when "
                   "it was built): rebuild with the CUDA Toolkit installed, or use --device cpu", device);
#endif
}

const char *td_model_device(const td_model *m)
{
#ifdef TD_HAVE_CUDA
    if (m->backend) return td_cuda_backend_desc();
#endif
    return m->backend ? m->backend->name : "cpu";
}

int td_device_mem_info(const char *device, size_t *free_bytes, size_t *total_bytes, td_error *err)
{
    int index;
    *free_bytes = *total_bytes = 0;
    if (parse_device(device, &index) || index < 0)
        return td_fail(err, "device '%s': no device memory to query (expected cuda or cuda:N)", device ? device : "");
#ifdef TD_HAVE_CUDA
    if (!td_cuda_backend_open(index, NULL, 0, err)) return -1;
    if (td_cuda_mem_info(free_bytes, total_bytes))
        return td_fail(err, "--device %s: cudaMemGetInfo failed", device);
    return 0;
#else
    return td_fail(err, "--device %s: this tidal was built without CUDA (nvcc was not on PATH when it was built): "
                   "rebuild with the CUDA Toolkit installed, or use --device cpu", device);
#endif
}

size_t td_device_mem_peak(void)
{
#ifdef TD_HAVE_CUDA
    return td_cuda_mem_peak();
#else
    return 0;
#endif
}

size_t td_device_d2h_bytes(void)
{
#ifdef TD_HAVE_CUDA
    return td_cuda_d2h_bytes();
#else
    return 0;
#endif
}
