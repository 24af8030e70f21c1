#!/usr/bin/env python3
"""tidal's chat-template interpreter against the installed Python jinja2, live: the cases of
chat_template_cases.py (published Qwen2.5 / Qwen3 / Llama 3.1 / Llama 3.2 templates over random
conversations with tools, plus one template per Jinja feature) are rendered by jinja2 now and
by tidal (build/tests/test_chat_template with TIDAL_CHAT_CASES), which must agree byte for byte.
The shipped golden file (tests/data/chat_templates/cases.json, used by `make check` without
jinja2) must still be what jinja2 renders. Exit 0 pass, 1 fail, 77 skip (jinja2 missing)."""
import json
import os
import subprocess
import sys
import tempfile

try:
    import jinja2  # noqa: F401
except ImportError:
    print("skip: jinja2 is not installed")
    sys.exit(77)

BUILD = os.environ.get("BUILD", "build")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
fails = 0
with tempfile.TemporaryDirectory() as tmp:
    live = os.path.join(tmp, "cases.json")
    subprocess.run([sys.executable, os.path.join(ROOT, "tests", "py", "chat_template_cases.py"), live], check=True, cwd=ROOT)
    p = subprocess.run([os.path.join(ROOT, BUILD, "tests", "test_chat_template")], cwd=ROOT, capture_output=True,
                       text=True, env=dict(os.environ, TIDAL_CHAT_CASES=live))
    print(p.stdout[-3000:], p.stderr[-3000:])
    if p.returncode != 0:
        print("FAIL: tidal's renderings differ from jinja2's (above)")
        fails += 1
    with open(live, encoding="utf-8") as f:
        now = json.load(f)["cases"]
    with open(os.path.join(ROOT, "tests", "data", "chat_templates", "cases.json"), encoding="utf-8") as f:
        shipped = json.load(f)["cases"]
    same = [a.get("expected") == b.get("expected") for a, b in zip(now, shipped)]
    if len(now) != len(shipped) or not all(same):
        print("FAIL: tests/data/chat_templates/cases.json is not what jinja2 renders now "
              "(regenerate: .venv/bin/python tests/py/chat_template_cases.py tests/data/chat_templates/cases.json)")
        fails += 1
print("chat template check: %s" % ("FAIL" if fails else "ok"))
sys.exit(1 if fails else 0)
