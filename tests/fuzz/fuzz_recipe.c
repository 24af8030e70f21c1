/* Fuzz target: recipe JSON (td_recipe_from_json in memory, and td_recipe_resolve on a file).
 * An accepted recipe must pass td_recipe_check and survive to_json -> from_json unchanged. */
#include "fuzz_util.h"
#include "tidal/recipe.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    td_error err;
    td_recipe r, r2;
    if (td_recipe_from_json((const char *)data, size, "fuzz", &r, &err) == 0) {
        if (td_recipe_check(&r, "fuzz", &err) != 0) { fprintf(stderr, "accepted but check fails: %s\n", err.msg); abort(); }
        char *j = td_recipe_to_json(&r);
        if (td_recipe_from_json(j, strlen(j), "roundtrip", &r2, &err) != 0) {
            fprintf(stderr, "to_json output not re-read: %s\n%s\n", err.msg, j);
            abort();
        }
        char *j2 = td_recipe_to_json(&r2);
        if (strcmp(j, j2) != 0) { fprintf(stderr, "roundtrip differs:\n%s\n%s\n", j, j2); abort(); }
        free(j);
        free(j2);
    }
    char path[600];
    fz_write(path, sizeof path, "recipe.json", data, size);
    td_recipe_resolve(path, &r, &err);
    return 0;
}
