# What the prepared GPU commands share, sourced by scripts/gpu_probe.sh and scripts/gpu_vllm.sh: the carried
# wheels' install and the deadline loop.
#
# `install_wheels`: WHEELS (.gpu-wheels/, made by scripts/gpu_wheels.sh) into DEPS with pip, offline and
# --no-deps, once (DEPS/.installed); PY3 is the GPU machine's python. Exported for the steps' subshells.
install_wheels() {
  [ -f "$WHEELS/requirements.txt" ] || { echo "$WHEELS/requirements.txt is missing: run 'bash scripts/gpu_wheels.sh' where PyPI is reachable, then carry $WHEELS"; return 1; }
  [ -f "$DEPS/.installed" ] && return 0
  rm -rf "$DEPS"
  "$PY3" -m pip --isolated install --quiet --no-index --no-deps --target "$DEPS" --find-links "$WHEELS" \
    -r "$WHEELS/requirements.txt" && touch "$DEPS/.installed"
}
export -f install_wheels

# `open_outputs DIR`: START (now), OUTDIR (DIR, made), SUMMARY (summary.txt) and RESULTS (results.jsonl), both
# emptied; `say LINE` prints a line and appends it to the summary.
open_outputs() {
  START=$SECONDS
  OUTDIR=$1
  mkdir -p "$OUTDIR"
  SUMMARY=$OUTDIR/summary.txt
  RESULTS=$OUTDIR/results.jsonl
  : > "$SUMMARY"
  : > "$RESULTS"
}
say() { echo "$*" | tee -a "$SUMMARY"; }

# For `run_steps` the caller sets STEPS (in order), PLANNED[step] (seconds), CMDS[step], DEADLINE_S and
# MARGIN_S, opens the outputs and defines `record STEP STATUS SECONDS PLANNED BOUND LOG`.
# `run_steps TAG WIDTH [FATAL...]`: each step runs under `timeout` min(2 x planned, seconds left before the
# deadline - margin), or is skipped (a line saying so) when less than half its planned time is left; one
# summary line per step (name padded to WIDTH, ok/failed/timeout/skipped, seconds), its log in
# OUTDIR/<step>.log; a FATAL step that does not pass skips every later step. Sets FAILED (0: all ok).
run_steps() {
  local tag=$1 width=$2
  shift 2
  local fatal=" $* " i s r planned left bound log t0 rc took status
  FAILED=0
  for i in "${!STEPS[@]}"; do
    s=${STEPS[$i]}
    planned=${PLANNED[$s]}
    left=$(( DEADLINE_S - (SECONDS - START) - MARGIN_S ))
    bound=$(( 2 * planned < left ? 2 * planned : left ))
    log=$OUTDIR/$s.log
    if [ "$bound" -lt $(( planned / 2 )) ]; then
      say "$(printf "%-${width}s skipped   %4ss (only %ss left before the %ss deadline; planned %ss)" "$s" 0 "$left" "$DEADLINE_S" "$planned")"
      record "$s" skipped 0 "$planned" 0 /dev/null
      continue
    fi
    t0=$SECONDS
    timeout -k 10 "$bound" bash -c "${CMDS[$s]}" > "$log" 2>&1
    rc=$?
    took=$(( SECONDS - t0 ))
    case $rc in 0) status=ok ;; 124|137) status=timeout; FAILED=1 ;; *) status=failed; FAILED=1 ;; esac
    say "$(printf "%-${width}s %-8s %5ss (planned %ss, bound %ss)" "$s" "$status" "$took" "$planned" "$bound")"
    [ "$status" = ok ] || tail -n 15 "$log" | sed 's/^/    | /'
    record "$s" "$status" "$took" "$planned" "$bound" "$log"
    if [ "$status" != ok ] && [[ $fatal == *" $s "* ]]; then
      say "[$tag] $s did not pass: no later step can run"
      for r in "${STEPS[@]:$(( i + 1 ))}"; do
        say "$(printf "%-${width}s skipped   %4ss (%s did not pass)" "$r" 0 "$s")"
        record "$r" skipped 0 "${PLANNED[$r]}" 0 /dev/null
      done
      break
    fi
  done
}
