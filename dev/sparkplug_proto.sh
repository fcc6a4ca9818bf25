#!/usr/bin/env bash
# Compile Sparkplug B's schema (edge_client/wire/sparkplug_b.proto: Eclipse Tahu's, EPL-2.0,
# as shipped in the pysparkplug 0.6.1 sdist on PyPI, unchanged) into the module the ingest
# daemon decodes with. protoc 29.0 (grpcio-tools 1.71.0) writes gencode for protobuf 5.29,
# the version Flower 1.42's own modules are generated for, so it runs on every protobuf the
# project's Flower allows. A throwaway venv: grpcio-tools is a build tool, not a dependency.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
tools="$(mktemp -d)"
trap 'rm -rf "$tools"' EXIT
python3 -m venv "$tools/venv"
"$tools/venv/bin/pip" install -q "grpcio-tools==1.71.0"
cd "$here/edge_client/wire"
"$tools/venv/bin/python" -m grpc_tools.protoc -I. --python_out=. --pyi_out=. sparkplug_b.proto
echo "wrote edge_client/wire/sparkplug_b_pb2.py and .pyi"
