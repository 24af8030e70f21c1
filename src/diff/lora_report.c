/* A merged adapter's survival (lora.h), reported by the diff job (src/diff/job.h). */
#include "job.h"

#include <stdio.h>

/* On stderr and as root attributes lora_survival_X, lora_changed_frac_X, lora_aligned_X
 * (X = a or b). Nothing for an unmerged adapter. */
int lora_report(job *J, char path, td_lora_merge_stats st, const td_recipe *r, td_error *err)
{
    if (!st.merged) return 0;
    const td_format_traits *ft = td_format_info(r->weights);
    fprintf(stderr, "lora: merged into %s weights of path %c: %.1f%% of the update survives (%.1f%% of elements changed, "
            "%.1f%% along the update)\n", ft ? ft->name : "?", path == 'a' ? 'A' : 'B', 100 * st.survival,
            100 * st.changed_frac, 100 * st.aligned);
    char k1[32], k2[32], k3[32];
    snprintf(k1, sizeof k1, "lora_survival_%c", path);
    snprintf(k2, sizeof k2, "lora_changed_frac_%c", path);
    snprintf(k3, sizeof k3, "lora_aligned_%c", path);
    if (td_runfile_set_f64(J->rf, k1, st.survival, err) || td_runfile_set_f64(J->rf, k2, st.changed_frac, err) ||
        td_runfile_set_f64(J->rf, k3, st.aligned, err)) return -1;
    return 0;
}
