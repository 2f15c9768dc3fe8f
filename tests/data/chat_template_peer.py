"""strata's chat templates (src/strata/data/jinja.h) against transformers.

Every template of TEMPLATES_DIR (*.jinja, with its special tokens from special_tokens.json) renders
every conversation of TEMPLATES_DIR/conversations.jsonl, with add_generation_prompt false and
true, through transformers' own machinery (render_jinja_template, what apply_chat_template calls:
jinja2's ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks, loopcontrols and
transformers' raise_exception, strftime_now, tojson and {% generation %}) and through strata's
render_chat_template. Each pair must be identical byte for byte, and so must the generation
blocks' spans; where transformers raises, strata must fail too, with raise_exception's message.

    chat_template_peer.py RENDER_CHAT_TEMPLATE TEMPLATES_DIR
"""

import difflib
import json
import subprocess
import sys
from pathlib import Path

import jinja2
from transformers.utils import logging
from transformers.utils.chat_template_utils import render_jinja_template

logging.set_verbosity_error()


def transformers_render(template, context):
    ctx = dict(context)
    rendered, spans = render_jinja_template(
        conversations=[ctx.pop("messages")],
        tools=ctx.pop("tools"),
        documents=ctx.pop("documents"),
        chat_template=template,
        return_assistant_tokens_mask=True,
        add_generation_prompt=ctx.pop("add_generation_prompt"),
        **ctx,
    )
    text = rendered[0]
    # transformers counts characters; strata reports bytes of the UTF-8 text.
    to_bytes = lambda i: len(text[:i].encode("utf-8"))
    return text, [[to_bytes(b), to_bytes(e)] for b, e in spans[0]]


def strata_render(binary, template_path, context):
    proc = subprocess.run(
        [binary, str(template_path), "--json"],
        input=json.dumps(context, ensure_ascii=False).encode("utf-8"),
        capture_output=True,
    )
    if proc.returncode != 0:
        return None, None, proc.stderr.decode("utf-8", "replace").strip()
    out = json.loads(proc.stdout)
    return out["rendered"], out["generation_spans"], None


def show_diff(expected, got):
    lines = difflib.unified_diff(
        [repr(line) + "\n" for line in expected.splitlines(keepends=True)],
        [repr(line) + "\n" for line in got.splitlines(keepends=True)],
        "transformers",
        "strata",
    )
    return "".join(list(lines)[:80])


def check(binary, template_path, template, context):
    """One comparison: (what differs or None, what transformers raised or None)."""
    try:
        expected, expected_spans = transformers_render(template, context)
        error = None
    except Exception as e:  # what the template raised, compared below
        expected, expected_spans, error = None, None, e
    got, spans, got_error = strata_render(binary, template_path, context)
    if error is not None:
        raised = f"{type(error).__name__}: {error}"
        if got_error is None:
            return f"transformers raised {raised}\nstrata rendered {got!r}", raised
        if type(error) is jinja2.exceptions.TemplateError and str(error) not in got_error:
            return f"raise_exception({str(error)!r}) in transformers, strata: {got_error}", raised
        return None, raised
    if got_error is not None:
        return f"strata failed: {got_error}\ntransformers rendered {expected!r}", None
    if got != expected:
        return "renderings differ (repr of each line):\n" + show_diff(expected, got), None
    if spans != expected_spans:
        return f"generation spans differ: transformers {expected_spans}, strata {spans}", None
    return None, None


def main():
    binary, templates_dir = sys.argv[1], Path(sys.argv[2])
    tokens = json.loads((templates_dir / "special_tokens.json").read_text())
    conversations = [
        json.loads(line)
        for line in (templates_dir / "conversations.jsonl").read_text(encoding="utf-8").split("\n")
        if line.strip()
    ]
    passed, failed, spans = 0, 0, 0
    for template_path in sorted(templates_dir.glob("*.jinja")):
        template = template_path.read_text(encoding="utf-8")
        for conv in conversations:
            for add_generation_prompt in (False, True):
                context = {
                    "messages": conv["messages"],
                    "tools": conv.get("tools"),
                    "documents": None,
                    "add_generation_prompt": add_generation_prompt,
                    **tokens[template_path.stem],
                    **conv.get("extra", {}),
                }
                problem, raised = check(binary, template_path, template, context)
                if problem is not None:
                    # strftime_now: a render on each side of midnight differs once; retry.
                    problem, raised = check(binary, template_path, template, context)
                case = f"{template_path.stem} x {conv['name']} (add_generation_prompt={add_generation_prompt})"
                if problem is not None:
                    failed += 1
                    print(f"MISMATCH {case}\n{problem}\n")
                    continue
                passed += 1
                if raised is not None:
                    print(f"both fail: {case}: {raised}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or passed == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
