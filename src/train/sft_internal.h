/* tidal — the parts of tidal-sft's library side (include/tidal/sft.h), internal. */
#ifndef TIDAL_SFT_INTERNAL_H
#define TIDAL_SFT_INTERNAL_H

#include "tidal/checkpoint.h"
#include "tidal/sft.h"

/* One training sequence: prompt (with the tokenizer's specials) + completion + EOS. */
typedef struct {
    int *ids;
    int len;                 /* prompt + completion + 1 */
    int plen;                /* prompt tokens: targets t >= plen - 1 are in the loss */
} sft_example;

typedef struct {
    const char *path;
    td_task_item *items;
    size_t n;
    sft_example *ex;         /* (n) tokenised records (prompt only when there is no completion) */
    int max_len;             /* longest sequence                                                */
    int max_response;        /* longest reference completion + EOS, in tokens                   */
} sft_data;

/* Reads and tokenises a task dataset. need_completion: every record must have one (training).
 * Characters the tokenizer maps to its unknown token, or ids past vocab, are errors naming the
 * file and line. */
int sft_data_load(sft_data *d, const char *path, const td_tokenizer *tok, int vocab, int need_completion,
                  td_error *err);
void sft_data_free(sft_data *d);


/* checkpoints (sft_save.c) */
typedef struct {
    int global_step;         /* optimiser steps done, skipped ones included */
    long skipped;
    double epoch;
    uint64_t seed;
    char settings[8192];     /* the run's settings as JSON (sft.c: what --resume must keep); "" in
                                checkpoints written before tidal recorded them */
} sft_progress;

/* Writes the model (and tokenizer, generation config) of trainer tr into dir (created), each
 * file through a temporary name; with_state 1 adds trainer_state.json, 2 optimizer.safetensors too. */
int sft_save_dir(const td_trainer *tr, const td_sft_opts *o, const td_tokenizer *tok, const char *dir,
                 int with_state, const sft_progress *p, td_error *err);
/* output_dir/checkpoint-K for the largest K (0: none); path into buf. */
int sft_latest_checkpoint(const char *output_dir, char *buf, size_t cap);
/* Reads trainer_state.json of a checkpoint directory. */
int sft_read_progress(const char *dir, sft_progress *p, td_error *err);
/* Moves the files sft_save_dir wrote in tmpdir into dir (one rename each), then removes tmpdir. */
int sft_publish(const char *tmpdir, const char *dir, td_error *err);
/* Removes a checkpoint directory tidal-sft wrote (its known files, then the folder). */
void sft_remove_dir(const char *dir);

#endif
