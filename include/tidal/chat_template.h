/* tidal — chat templates: the Jinja "chat_template" of a tokenizer_config.json, rendered as
 * transformers' apply_chat_template(messages, tokenize=False, add_generation_prompt=...)
 * renders it, so conversational prompts become the exact text the trainer and the engine saw.
 *
 * The interpreter covers the Jinja subset that published chat templates use (checked against
 * Python jinja2 on the Qwen2.5, Qwen3 and Llama 3.1/3.2/3.3 Instruct templates, shipped in
 * tests/data/chat_templates): trim_blocks + lstrip_blocks and "-" whitespace control;
 * {% if/elif/else %}, {% for a[, b] in x [if c] %} with loop.index/index0/first/last/length/
 * revindex, {% else %} on loops, {% set x = ... %} and {% set ns.attr = ... %}, break/continue,
 * {% generation %}; literals, lists, dicts, attribute / subscript / slice access, calls of
 * namespace(), raise_exception(), strftime_now(), range(), dict(); string methods (startswith,
 * endswith, split, strip/lstrip/rstrip, lower, upper, replace, find), dict methods (items,
 * keys, values, get); operators with Jinja's precedence; filters trim, length/count, tojson
 * (transformers' variant: ensure_ascii=False, indent=), items, join, first, last, lower, upper,
 * capitalize, string, list, default/d, reject/select, rejectattr/selectattr, map(attribute=),
 * replace, int, float, abs; tests defined, undefined, none, string, number, integer, float,
 * boolean, true, false, mapping, iterable, sequence, equalto/eq/sameas, ne, odd, even, in.
 * Anything else (macros, includes, other filters) is refused when the template is parsed or
 * met, with the template line and the construct named. Tuples are lists here (str() of a
 * tuple prints as a list would); floats print as Python's repr for common magnitudes.
 *
 * strftime_now() is defined, as transformers defines it (Llama 3.2 prints today's date): the
 * local time now, or, when the environment sets SOURCE_DATE_EPOCH, that time in UTC, so runs
 * can be reproduced. */
#ifndef TIDAL_CHAT_TEMPLATE_H
#define TIDAL_CHAT_TEMPLATE_H

#include "tidal/common.h"

#include <jansson.h>
#include <stdbool.h>

TD_BEGIN_DECLS

typedef struct td_chat_template td_chat_template;

/* Parses template text; NULL + err ("chat template line N: ...") on a syntax error or an
 * unsupported statement. */
td_chat_template *td_chat_template_parse(const char *text, size_t len, td_error *err);
void td_chat_template_free(td_chat_template *t);

/* Renders messages (a JSON array of {"role", "content", ...}) with add_generation_prompt and
 * the variables in vars (an object, may be NULL: bos_token, eos_token, tools, enable_thinking,
 * ...). *out is malloc'd (caller frees), NUL-terminated, *out_len bytes. -1 + err naming the
 * template line and the problem (an undefined value used, raise_exception(), a type error). */
int td_chat_template_render(const td_chat_template *t, json_t *messages, bool add_generation_prompt,
                            json_t *vars, char **out, size_t *out_len, td_error *err);

TD_END_DECLS

#endif
