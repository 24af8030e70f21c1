/* Rollout records in the shapes RL frameworks write them (internal to src/io; the formats are
 * documented in include/tidal/prompts.h and datasets/rollouts/README.md). */
#ifndef TIDAL_IO_ROLLOUTS_H
#define TIDAL_IO_ROLLOUTS_H

#include "tidal/prompts.h"

#include <jansson.h>

/* Up to n_max rollouts from one record o (a vLLM RequestOutput with n > 1 samples gives
 * several). Returns the number of rollouts (>= 1), 0 when o has none of the rollout keys (it
 * is a prompt), or -1 + err naming where, the format recognised, the fields found and the
 * fields expected. *format gets the format's name ("tidal", "trl", "verl", "vllm", "sglang"). */
int td_rollouts_from_json(json_t *o, const char *where, int vocab, td_prompt *out, int n_max,
                          const char **format, td_error *err);

/* The keys of object o as "a", "b", ... (cut with ", ..." at cap), for errors. */
void td_json_key_list(json_t *o, char *out, size_t cap);

#endif
