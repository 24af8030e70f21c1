/* tidal — the post-mortem's run folder opened: its log, the events, tidal-rl's recorded settings
 * and the checkpoints, tidal-rl's final model/ among them (include/tidal/postmortem.h). */
#include "tidal/postmortem.h"
#include "tidal/runfile.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int is_dir(const char *p) { struct stat st; return stat(p, &st) == 0 && S_ISDIR(st.st_mode); }
static int is_file(const char *p) { struct stat st; return stat(p, &st) == 0 && S_ISREG(st.st_mode); }

void td_pm_init(td_postmortem *pm, const td_pm_setup *set)
{
    memset(pm, 0, sizeof *pm);
    pm->set = *set;
    pm->events.drop_step = pm->events.onset_step = -1;
}

void td_postmortem_free(td_postmortem *pm)
{
    json_decref(pm->figures);
    json_decref(pm->alarms);
    free(pm->meas);
    td_pm_checkpoints_free(pm->ck, pm->nck);
    td_pm_events_free(&pm->events);
    td_pm_curves_free(&pm->curves);
    pm->figures = pm->alarms = NULL;
    pm->meas = NULL;
    pm->ck = NULL;
    pm->nck = pm->nmeas = 0;
}

/* rl.h5's rl_config and steps_done (best effort: what is missing keeps rl's value) */
static void rl_settings_read(const char *run_dir, td_pm_rl_settings *rl)
{
    char p[4400];
    snprintf(p, sizeof p, "%s/rl.h5", run_dir);
    td_runfile *rf = td_runfile_open(p, 0, NULL);
    char *cfg = rf ? td_runfile_get_str(rf, "rl_config", NULL) : NULL;
    json_t *j = cfg ? json_loads(cfg, 0, NULL) : NULL;
    if (j) {
        const char *s;
        if ((s = json_string_value(json_object_get(j, "model_path")))) snprintf(rl->model, sizeof rl->model, "%s", s);
        if ((s = json_string_value(json_object_get(j, "dataset_path")))) snprintf(rl->dataset, sizeof rl->dataset, "%s", s);
        if ((s = json_string_value(json_object_get(j, "train_recipe"))))
            snprintf(rl->train_recipe, sizeof rl->train_recipe, "%s", s);
        if ((s = json_string_value(json_object_get(j, "rollout_recipe"))))
            snprintf(rl->rollout_recipe, sizeof rl->rollout_recipe, "%s", s);
        if ((s = json_string_value(json_object_get(j, "lora_sync")))) snprintf(rl->lora_sync, sizeof rl->lora_sync, "%s", s);
        rl->max_completion = (int)json_integer_value(json_object_get(j, "max_completion_length"));
    }
    int64_t sd = -1;
    if (rf && !td_runfile_get_i64(rf, "steps_done", &sd, NULL)) rl->steps_done = (int)sd;
    json_decref(j);
    free(cfg);
    if (rf) td_runfile_close(rf, NULL);
}

/* tidal-rl's final policy, RUN_DIR/model/ (weights or an adapter), as the checkpoint of its last
 * step when no readable checkpoint has that step */
static void add_final_policy(const char *run_dir, int steps, td_pm_checkpoint **ck, size_t *nck)
{
    char p[4400], q[4500];
    snprintf(p, sizeof p, "%s/model", run_dir);
    if (!is_dir(p) || steps <= 0) return;
    int have = 0;
    for (size_t i = 0; i < *nck; i++) have |= (*ck)[i].step == steps && !(*ck)[i].unreadable;
    snprintf(q, sizeof q, "%s/adapter_config.json", p);
    int adapter = is_file(q);
    snprintf(q, sizeof q, "%s/config.json", p);
    if (!have && (adapter || is_file(q))) {
        *ck = td_xrealloc(*ck, (*nck + 1) * sizeof **ck);
        (*ck)[*nck] = (td_pm_checkpoint){steps, strdup(p), adapter, strdup(""), NULL};
        (*nck)++;
    }
}

int td_pm_open_run(td_postmortem *pm, td_pm_rl_settings *rl, td_error *err)
{
    const char *run_dir = pm->set.run_dir;
    if (td_pm_read(run_dir, &pm->curves, err) || td_pm_events_find(&pm->curves, &pm->set.collapse, &pm->events, err))
        return -1;
    int tidal_rl = !strcmp(pm->curves.format, "tidal-rl");
    if (tidal_rl) rl_settings_read(run_dir, rl);
    if (td_pm_checkpoints(run_dir, &pm->ck, &pm->nck, err)) return -1;
    if (tidal_rl) add_final_policy(run_dir, rl->steps_done, &pm->ck, &pm->nck);
    return 0;
}
