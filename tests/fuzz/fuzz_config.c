/* Fuzz target: config.json (td_config_parse, then td_config_validate on what it accepted) and
 * the same bytes as generation_config.json (td_gen_config_parse against a valid tiny config). */
#include "fuzz_util.h"
#include "tidal/checkpoint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[600];
    fz_write(path, sizeof path, "config.json", data, size);
    td_error err;
    td_config cfg;
    if (td_config_parse(path, &cfg, &err) == 0 && td_config_validate(&cfg, "fuzz", &err) != 0) {
        fprintf(stderr, "parse accepted a config that validate rejects: %s\n", err.msg);
        abort();
    }
    td_config tiny = {0};
    tiny.arch = TD_ARCH_LLAMA;
    if (td_config_preset("tiny", &tiny)) abort();
    td_gen_config g;
    td_gen_config_parse(path, &tiny, &g, &err);
    return 0;
}
