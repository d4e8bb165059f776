#!/usr/bin/env bash
# Install Coq (Debian/Ubuntu package; 8.16 on bookworm/jammy-era images) if coqc is missing.
set -euo pipefail
if command -v coqc >/dev/null 2>&1; then
  coqc --version | head -1
  exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq coq >/dev/null
coqc --version | head -1
