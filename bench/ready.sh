# Sourced by the bench scripts (POSIX sh). A program learns that a group
# serves, and where, from `switchyard up --ready-file FILE` (decision 0150),
# never from the human `listening on` line, which is free to change.
#
# ready_addr FILE PID: waits until the group PID has written FILE and
# prints the listener's address (`"http"`, port 0 resolved). Fails, saying
# why on stderr, when PID exits first or after 60 s.
ready_addr() {
    _ready_tries=0
    until [ -s "$1" ]; do
        # A zombie (exited, not yet reaped by this shell) is no longer running.
        _ready_state=$(sed 's/.*) //' "/proc/$2/stat" 2>/dev/null | cut -d' ' -f1)
        case $_ready_state in
        '' | Z) echo "pid $2 exited before it was ready" >&2; return 1 ;;
        esac
        _ready_tries=$((_ready_tries + 1))
        [ "$_ready_tries" -le 600 ] || { echo "pid $2 not ready after 60 s" >&2; return 1; }
        sleep 0.1
    done
    # The file appears whole (written aside and renamed): no partial read.
    python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["http"])' "$1"
}
