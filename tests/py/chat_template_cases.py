#!/usr/bin/env python3
"""Chat-template cases rendered by Python jinja2 configured as transformers' apply_chat_template
configures it (ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the
loopcontrols extension, transformers' tojson (json.dumps, ensure_ascii=False), raise_exception,
strftime_now; render(messages=..., tools=None, documents=None, add_generation_prompt=...,
bos_token=..., eos_token=...)).

    chat_template_cases.py OUT.json      writes the cases with jinja2's output as "expected"

The published templates are tests/data/chat_templates/*.jinja (Qwen2.5-7B-Instruct, Qwen3-0.6B,
Llama-3.1-8B-Instruct = 3.3's, Llama-3.2-3B-Instruct, as llama.cpp's get_chat_template.py
fetched them from the Hugging Face tokenizer_config.json files); the inline templates exercise
the Jinja features one by one. The shipped golden file tests/data/chat_templates/cases.json is
this script's output; test_chat_template.py regenerates it live and runs tidal on both.
"""
import datetime
import json
import os
import random
import sys

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TDIR = os.path.join(ROOT, "tests", "data", "chat_templates")
EPOCH = 1722000000          # SOURCE_DATE_EPOCH the C side is run with: 26 Jul 2024 UTC


def env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.fromtimestamp(EPOCH, datetime.timezone.utc).strftime(fmt)

    class Generation(jinja2.ext.Extension):      # transformers' AssistantTracker, without the tracking
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    e = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols])
    e.filters["tojson"] = tojson
    e.globals["raise_exception"] = raise_exception
    e.globals["strftime_now"] = strftime_now
    return e


TEXTS = ["Hello!", "What is 2 + 2?", "  padded with spaces  ", "\n\nleading newlines", "trailing newline\n",
         "naïve café — “quotes” ’n’ ‘apostrophes’", "日本語のテキスト", "emoji 👍🏽 and \u3000ideographic space\u3000",
         "\u00a0nbsp around\u00a0", "tab\tseparated", "", "multi\nline\n\ntext", "<think>\nreasoning here\n</think>\n\nanswer",
         "<think>short</think>final", "a 'single' and \"double\" quote", "back\\slash", "{{ not a template }}",
         "<|im_start|>literal special<|im_end|>", "   ", "x" * 300]


def conversation(rng):
    msgs = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": rng.choice(TEXTS)})
    for turn in range(rng.randint(1, 3)):
        msgs.append({"role": "user", "content": rng.choice(TEXTS)})
        if turn < 2 and rng.random() < 0.6:
            msgs.append({"role": "assistant", "content": rng.choice(TEXTS)})
    return msgs


TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                        "required": ["city"]}}}
TOOL_CALL_CONV = [
    {"role": "system", "content": "You can call tools."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather",
                                                                                         "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "content": "{\"temp\": 21.5, \"unit\": \"C\"}"},
    {"role": "user", "content": "Thanks"},
]

# Inline templates: one Jinja feature each (whitespace control, trim/lstrip, operators, filters,
# tests, slices, scoping, loops), rendered with messages = [{"role": "user", "content": "Hi there"}].
INLINE = [
    "a  {{- ' b ' -}}  c",
    "line1\n  {% if true %}\n    kept\n  {% endif %}\nline2\n",
    "x {%+ if true %}y{% endif +%}\nz",
    "{# comment #}\nA{#- trimmed -#}  B  {#+ kept +#}C",
    "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 7 / 2 }}",
    "{{ 'a' ~ 1 ~ none }} {{ 'x' * 3 }} {{ [1, 2] + [3] }} {{ {'k': 'v', 'n': 1} }} {{ 1.0 }} {{ 0.1 + 0.2 }} {{ true }}",
    "{{ 'abc'[1] }} {{ 'abcdef'[1:4] }} {{ 'abcdef'[::-1] }} {{ [1,2,3,4][-2:] }} {{ 'héllo'[1:3] }} {{ [1,2,3][::2] }}",
    "{{ '  x y  '|trim }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'xxhixx'.strip('x') }}|{{ 'a-b-c'.split('-', 1) }}",
    "{{ messages|length }} {{ 'héllo'|length }} {{ messages[0].content|upper }} {{ ['a','b']|join(', ') }} {{ [3,1]|first }}",
    "{{ {'b': [1, 'x'], 'a': none}|tojson }} {{ 'é\"\\n'|tojson }} {{ [1, {'a': 2.5}]|tojson(indent=2) }}",
    "{{ x is defined }} {{ messages is defined }} {{ none is none }} {{ 'a' is string }} {{ 1 is number }} {{ {} is mapping }} "
    "{{ 'a' is iterable }} {{ 3 is odd }} {{ x is not defined }} {{ false is false }} {{ 1 is equalto 1 }}",
    "{% set ns = namespace(n=0, s='') %}{% for m in ['a','b','c'] %}{% set ns.n = ns.n + loop.index %}"
    "{% set local = m %}{% set ns.s = ns.s ~ local %}{% endfor %}{{ ns.n }} {{ ns.s }} {{ local is defined }}",
    "{% for m in ['a','b','c','d'] %}{% if m == 'b' %}{% continue %}{% endif %}{% if m == 'd' %}{% break %}{% endif %}"
    "{{ loop.index0 }}{{ m }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }} {% endfor %}",
    "{% for k, v in {'x': 1, 'y': 2}|items %}{{ k }}={{ v }};{% endfor %}{% for k in {'p': 1} %}{{ k }}{% endfor %}"
    "{% for i in [] %}never{% else %}empty{% endfor %}{% for i in range(3) if i != 1 %}{{ i }}{{ loop.index }}{% endfor %}",
    "{{ 'yes' if messages else 'no' }} {{ 'a' in 'cat' }} {{ 2 in [1, 2] }} {{ 'k' not in {'k': 1} }} {{ not messages }} "
    "{{ 1 < 2 and 'b' >= 'a' or x }} {{ none or 'fallback' }} {{ '' and 'never' }}",
    "{{ messages[0].missing|default('dflt') }} {{ ''|default('e', true) }} {{ [1,2,3]|reject('equalto', 2)|list }} "
    "{{ [{'t': 'a'}, {'t': 'b'}]|selectattr('t', 'equalto', 'b')|map(attribute='t')|join }} {{ [0, 1, '']|select|list }}",
    "{{ 'Hello World'.startswith('Hello') }} {{ 'x.py'.endswith(('.c', '.py')) }} {{ 'aXbX'.replace('X', '-') }} "
    "{{ 'abc'.find('c') }} {{ {'a': 1}.get('b', 'none!') }} {% for k, v in {'a': 1}.items() %}{{ k }}{{ v }}{% endfor %} {{ 'hello'|capitalize }}",
    "{%- set messages = messages + [{'role': 'assistant', 'content': 'ok'}] %}{% for m in messages %}"
    "{% generation %}{{ m.role }}:{{ m.content }}{% endgeneration %}\n{% endfor %}",
    "{{ bos_token }}{% if tools is none %}no tools{% endif %}{{ eos_token }}{{ '\\u00e9\\x41\\t|' }}",
]

ERRORS = [  # (template, what tidal's message must contain): jinja2 fails on each as well
    ("{% if x %}never closed", "never closed"),
    ("{{ raise_exception('Conversation roles must alternate') }}", "Conversation roles must alternate"),
    ("{{ messages[5].content }}", "undefined"),
    ("{{ 1 + 'a' }}", "operator \"+\""),
    ("{{ messages|nosuchfilter }}", "filter \"nosuchfilter\""),
    ("{% endfor %}", "does not close"),
    ("{{ 'unterminated }}", "never closed"),
]


def main():
    out = sys.argv[1]
    rng = random.Random(16)
    e = env()
    cases = []
    base = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}

    def add(tname, ttext, msgs, gen, extra, error=None):
        kwargs = dict(base, tools=None, documents=None)
        kwargs.update(extra)
        case = {"messages": msgs, "add_generation_prompt": gen, "vars": kwargs}
        case.update({"template": tname} if tname else {"template_text": ttext})
        try:
            case["expected"] = e.from_string(ttext).render(messages=msgs, add_generation_prompt=gen, **kwargs)
            if error:
                raise SystemExit(f"jinja2 renders an error case without failing: {ttext!r}")
        except Exception as ex:  # TemplateError, UndefinedError, TypeError...
            if not error:
                raise
            case["error"] = error
            case["jinja2_error"] = str(ex)
        cases.append(case)

    for name in sorted(os.listdir(TDIR)):
        if not name.endswith(".jinja"):
            continue
        text = open(os.path.join(TDIR, name), encoding="utf-8").read()
        for i in range(12):
            msgs = conversation(rng)
            extra = {}
            if "Qwen3" in name and i % 3 == 0:
                extra["enable_thinking"] = False
            add(name, text, msgs, i % 4 != 3, extra)
        add(name, text, TOOL_CALL_CONV, True, {"tools": [TOOL]})
        if "Llama" in name:
            add(name, text, TOOL_CALL_CONV[1:], True, {"tools": [TOOL], "tools_in_user_message": False})
            add(name, text, [{"role": "user", "content": "hi"}], True, {"date_string": "01 Jan 2025"})
    hi = [{"role": "user", "content": "Hi there"}]
    # valid Jinja outside tidal's subset: tidal refuses it by name (jinja2 renders it)
    cases.append({"template_text": "{% macro m() %}x{% endmacro %}{{ m() }}", "messages": hi, "add_generation_prompt": True,
                  "vars": base, "error": "the tag \"macro\" is not supported"})
    for t in INLINE:
        add(None, t, hi, True, {})
    for t, needle in ERRORS:
        add(None, t, hi, True, {}, error=needle)
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"source_date_epoch": EPOCH, "jinja2": jinja2.__version__, "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(cases)} cases written to {out}")


if __name__ == "__main__":
    main()
