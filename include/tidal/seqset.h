/* tidal — a set of token sequences to run through the model again: the prompts (and replayed
 * responses) of a prompts file, or the prompt + response ids a run file recorded, with the
 * batch each sequence ran in. What tidal-headroom and tidal-attribute read their inputs with. */
#ifndef TIDAL_SEQSET_H
#define TIDAL_SEQSET_H

#include "tidal/common.h"

TD_BEGIN_DECLS

typedef struct {
    int n;                 /* sequences                                                    */
    int32_t **tok;         /* (n) prompt + response ids                                    */
    int *len, *plen;       /* (n) full and prompt lengths                                  */
    int64_t *batch;        /* (n) the run's /seqs/batch (run files), else i / 8            */
    int max_len;           /* longest sequence                                             */
} td_seqset;

/* A prompts JSONL (td_prompts_load: "text" prompts through the checkpoint's tokenizer.json,
 * token prompts, rollouts with their responses). vocab_size and ctx bound the ids and lengths. */
int td_seqset_from_prompts(td_seqset *s, const char *model_dir, const char *prompts_path, int vocab_size,
                           int ctx, td_error *err);
/* The sequences of a tidal-diff run file (/prompts/tokens by /seqs/tokens_offset, prompt_len,
 * response_len, batch), in the file's order. Errors name the file and the dataset. */
int td_seqset_from_run(td_seqset *s, const char *run_path, td_error *err);
void td_seqset_free(td_seqset *s);

TD_END_DECLS

#endif
