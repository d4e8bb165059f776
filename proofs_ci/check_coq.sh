#!/usr/bin/env bash
# Check the derivc Coq proof library:
#   1. install coqc if missing (proofs_ci/install_coq.sh)
#   2. compile every file of proofs_ci/coq/_CoqProject in dependency order, in place
#      (so obligations can then use `coqc -R proofs_ci/coq Derivc StepNN_<rule>.v`)
#   3. compile the worked obligation examples (examples/) and the models of the algebra (models/:
#      the intended one over Coq's reals, and GF(2) showing what is NOT provable about -inf)
#   4. rule-theorem names in both libraries, integrity scan, Coq Print Assumptions
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
command -v coqc >/dev/null 2>&1 || bash "$HERE/install_coq.sh"
cd "$HERE/coq"
for f in $(grep -E '\.v[[:space:]]*$' _CoqProject); do
  echo "coqc $f"
  coqc -R . Derivc "$f"
done
for f in examples/*.v models/*.v; do
  echo "coqc $f"
  coqc -R . Derivc "$f"
done
cd "$ROOT"
python3 -m proofs_ci.theorems --coq
echo "Coq proof library OK"
