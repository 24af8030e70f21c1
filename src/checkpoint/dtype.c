/* safetensors dtype names and their tidal number formats. */
#include "tidal/checkpoint.h"

#include <string.h>
#include <strings.h>

static const struct {
    const char *name;
    size_t size;
    td_format format;
} dtypes[TD_DT_COUNT] = {
    [TD_DT_F32] = {"F32", 4, TD_F32},
    [TD_DT_F16] = {"F16", 2, TD_F16},
    [TD_DT_BF16] = {"BF16", 2, TD_BF16},
    [TD_DT_F8_E4M3] = {"F8_E4M3", 1, TD_E4M3},
};

const char *td_dtype_name(td_dtype dt)
{
    if (dt == TD_DT_I64) return "I64";
    return (unsigned)dt < TD_DT_COUNT ? dtypes[dt].name : "?";
}
size_t td_dtype_size(td_dtype dt)
{
    if (dt == TD_DT_I64) return 8;
    return (unsigned)dt < TD_DT_COUNT ? dtypes[dt].size : 0;
}
td_format td_dtype_format(td_dtype dt) { return (unsigned)dt < TD_DT_COUNT ? dtypes[dt].format : TD_F32; }

int td_dtype_from_name(const char *s)
{
    for (int i = 0; i < TD_DT_COUNT; i++)
        if (strcmp(s, dtypes[i].name) == 0) return i;
    return -1;
}

int td_dtype_parse(const char *s)
{
    static const struct { const char *alias; td_dtype dt; } aliases[] = {
        {"f32", TD_DT_F32}, {"fp32", TD_DT_F32}, {"float32", TD_DT_F32},
        {"f16", TD_DT_F16}, {"fp16", TD_DT_F16}, {"float16", TD_DT_F16},
        {"bf16", TD_DT_BF16}, {"bfloat16", TD_DT_BF16},
        {"e4m3", TD_DT_F8_E4M3}, {"fp8", TD_DT_F8_E4M3}, {"fp8-e4m3", TD_DT_F8_E4M3},
        {"f8_e4m3", TD_DT_F8_E4M3}, {"float8_e4m3fn", TD_DT_F8_E4M3},
    };
    int d = td_dtype_from_name(s);
    if (d >= 0) return d;
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (strcasecmp(s, aliases[i].alias) == 0) return (int)aliases[i].dt;
    return -1;
}
