# Sourced on the host by scripts/guest-tests and scripts/tcg-modes.
#
#   test_binary PACKAGE TEST
#
# Builds PACKAGE's integration test TEST with PACKAGE's verbs feature and
# prints the test executable's path (nothing if the build failed).
test_binary() {
    cargo test -p "$1" --features "$1/verbs" --test "$2" --no-run --message-format=json 2>/dev/null |
        grep -o "\"executable\":\"[^\"]*/$2-[^\"]*\"" | tail -1 | cut -d'"' -f4
}
