#!/usr/bin/env bash
# strata's chat templates (src/strata/data/jinja.h) against transformers (PyPI, in the peer venv):
# the real templates of Llama 3.1, Qwen2.5, Qwen3, Gemma 3, Mistral v0.3, SmolLM3 and Hermes 3
# (tests/data/chat_templates/) on every conversation of conversations.jsonl, with and without the
# generation prompt, rendered by transformers' render_jinja_template and by render_chat_template;
# every rendering and generation span must be identical, and every error shared
# (chat_template_peer.py). The peer is transformers 4.57 without PyTorch (it renders templates with
# jinja2 alone) in /tmp/strata-template-venv (scripts/peer_venv.sh; STRATA_TEMPLATE_VENV
# overrides). Exits 77 (skip) when the venv cannot be made, e.g. without network.
#
#   tests/data/chat_template_peer_test.sh RENDER_CHAT_TEMPLATE
set -euo pipefail
render=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
export STRATA_PEER_VENV=${STRATA_TEMPLATE_VENV:-/tmp/strata-template-venv}
py=$("$root/scripts/peer_venv.sh" "transformers==4.57.6" "jinja2>=3.1") || exit 77
"$py" "$here/chat_template_peer.py" "$render" "$here/chat_templates"
