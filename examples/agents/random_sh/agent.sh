#!/bin/sh
# A uniformly random arena agent in POSIX shell, with no external commands per move.
# It relies on the protocol's promise (docs/arena_protocol.md) that the arena writes compact
# JSON with the keys in a fixed order, so parameter expansion finds the fields.
set -f                         # no globbing when splitting the legal actions
state=1
while IFS= read -r line; do
    case "$line" in
        '{"type":"hello"'*)
            printf '{"type":"ready","name":"random-sh"}\n' ;;
        '{"type":"start"'*)
            seed=${line#*\"seed\":}; seed=${seed%%,*}
            state=$(( seed % 2147483648 )) ;;
        '{"type":"act"'*)
            legal=${line#*\"legal_actions\":[}; legal=${legal%%]*}
            IFS=,; set -- $legal; unset IFS
            # the C standard's example rand(): state' = state * 1103515245 + 12345 mod 2^31
            state=$(( (state * 1103515245 + 12345) % 2147483648 ))
            i=$(( state / 65536 % $# + 1 ))
            eval "action=\${$i}"
            printf '{"type":"action","action":%s}\n' "$action" ;;
        '{"type":"shutdown"'*)
            exit 0 ;;
    esac
done
