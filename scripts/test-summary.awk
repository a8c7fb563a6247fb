#!/usr/bin/awk -f
# Reads the output of the test command (cargo-nextest runs and cargo test
# runs, one after another) and prints one line adding up every run's
# results, then the name of each failing test with its binary, and each
# test binary that ended without a result (crashed, or failed to build).
# Exits 1 when anything failed.

# cargo-nextest: `Summary [ 117.0s] 361 tests run: 360 passed, 1 failed, ...`
# and `FAIL [ 1.234s] (12/361) lock-tests::quorum name` per failure (once as
# it happens, once in the final list: counted once).
/^ +Summary \[/ {
    for (i = 1; i <= NF; i++) {
        if ($(i + 1) ~ /^passed/) passed += $i
        if ($(i + 1) ~ /^failed/) failed += $i
    }
}
/^ +(FAIL|TIMEOUT|SIGSEGV|SIGABRT|ABORT) \[/ {
    name = $0
    sub(/^ +[A-Z]+ \[[^]]*\] (\([0-9]+\/[0-9]+\) )?/, "", name)
    if (!(name in seen)) { seen[name] = 1; failures[++count] = name }
}

# cargo test (the doctests): `Running ...` / `Doc-tests crate` name the
# binary, `test result:` adds up, `test x ... FAILED` names a failure.
/^     Running / || /^   Doc-tests / {
    if ($1 == "Running") {
        binary = $NF
        gsub(/[()]/, "", binary)
        sub(/^.*\//, "", binary)
        sub(/-[0-9a-f]+$/, "", binary)
    } else {
        binary = "doc-tests " $2
    }
    ran[binary] = 1
}
/^test result:/ {
    for (i = 1; i <= NF; i++) {
        if ($(i + 1) ~ /^passed/) passed += $i
        if ($(i + 1) ~ /^failed/) failed += $i
    }
    done[binary] = 1
}
/^test .* \.\.\. FAILED$/ {
    name = $0
    sub(/^test /, "", name)
    sub(/ \.\.\. FAILED$/, "", name)
    failures[++count] = binary ": " name
}
/^error: .*(could not compile|test failed|failed to run)/ { errors[++error_count] = $0 }
END {
    printf "tests: %d passed, %d failed\n", passed, failed
    for (i = 1; i <= count; i++) printf "  FAILED %s\n", failures[i]
    for (b in ran) if (!(b in done)) { printf "  NO RESULT %s (crashed, killed or not built: see its output)\n", b; broken = 1 }
    for (i = 1; i <= error_count; i++) if (count == 0 && !broken) printf "  %s\n", errors[i]
    exit (failed > 0 || count > 0 || broken || error_count > 0) ? 1 : 0
}
