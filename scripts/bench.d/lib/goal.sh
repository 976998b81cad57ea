# Shared by the scripts/bench.d parts (sourced): judging a measurement against its goal, so that every table that
# states a goal says "met" or "MISSED" per row and scripts/bench can end with every miss (and exit non-zero).
# A miss is appended as one line to $FLEET_BENCH_MISSED (set by scripts/bench; a part run alone prints only).

# goal LABEL VALUE OP LIMIT [SHOWN]: prints `met (OP SHOWN)` or `MISSED (OP SHOWN)` for a table cell; OP is one of
# <= < >= > ==, VALUE and LIMIT are numbers in the same unit, SHOWN is the limit as a person reads it (default
# LIMIT). A VALUE that is not a number (the measurement did not produce one) is a miss.
goal() {
  local label=$1 value=$2 op=$3 limit=$4 shown=${5:-$4} sym
  case $op in
    "<=") sym="≤ " ;; ">=") sym="≥ " ;; "==") sym="" ;; *) sym="$op " ;;
  esac
  if awk -v v="$value" -v l="$limit" -v op="$op" 'BEGIN {
       if (v !~ /^-?[0-9]+(\.[0-9]+)?$/) exit 1
       v += 0; l += 0
       ok = (op == "<=") ? v <= l : (op == "<") ? v < l : (op == ">=") ? v >= l : (op == ">") ? v > l : (op == "==") ? v == l : 0
       exit !ok }'; then
    echo "met ($sym$shown)"
  else
    echo "MISSED ($sym$shown)"
    goal_missed "$label: ${value:-no value}, goal $sym$shown"
  fi
}

# errors LABEL COUNT: `0 errors` as a goal (any other count, or none measured, is a miss); prints the cell.
errors() {
  goal "$1: errors" "$2" "==" 0 "0 errors"
}

# goal_missed TEXT: records a miss that is not a number against a limit (a part that failed, a missing row).
goal_missed() {
  echo "${FLEET_BENCH_PART:-$(basename "$0" .sh)}: $1" >>"${FLEET_BENCH_MISSED:-/dev/null}"
}

# cell FILE PATTERN N: column N (1 = first cell) of the first Markdown table row in FILE containing PATTERN
# (fixed string), trimmed; empty when there is no such row.
cell() {
  awk -F'|' -v p="$2" -v n="$3" 'index($0, p) && /^\|/ { c = $(n + 1); gsub(/^ +| +$/, "", c); print c; exit }' "$1"
}

# trim TEXT: TEXT without leading and trailing blanks.
trim() {
  sed 's/^[[:space:]]*//; s/[[:space:]]*$//' <<<"$1"
}

# number TEXT: the first number in TEXT (`3.50 MiB` → 3.50, `1,234 keys/s` → 1234); empty when there is none.
number() {
  tr -d ',' <<<"$1" | grep -oE -- '-?[0-9]+(\.[0-9]+)?' | head -n1 || true
}
