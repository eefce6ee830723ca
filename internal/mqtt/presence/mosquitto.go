package presence

import (
	"regexp"
	"strings"
	"time"
)

// MosquittoLogTopic is where Mosquitto 2.0 publishes its notice-level log lines (connects and
// disconnects) when its configuration has `log_dest topic` and `log_type notice`.
const MosquittoLogTopic = "$SYS/broker/log/N"

// The lines of Mosquitto 2.0.x (src/loop.c do_disconnect, src/handle_connect.c) that say a
// client connected or went. Client IDs in a2a-fleet are {org}/{unit}/{agent} and never contain
// spaces.
var (
	connectLine = regexp.MustCompile(`^New client connected from \S+ as (\S+) \(`)
	leaveLines  = []struct {
		re     *regexp.Regexp
		reason string // "" = the rest of the line
	}{
		{regexp.MustCompile(`^Client (\S+) disconnected\.$`), "disconnected (the client sent DISCONNECT)"},
		{regexp.MustCompile(`^Client (\S+) closed its connection\.$`), "connection closed without DISCONNECT"},
		{regexp.MustCompile(`^Client (\S+) has exceeded timeout, disconnecting\.$`), "keep-alive timeout: the client went silent"},
		{regexp.MustCompile(`^Client (\S+) been disconnected by administrative action\.$`), "disconnected by the broker (administrative action: its credentials or rights changed, or it was deleted)"},
		{regexp.MustCompile(`^Client (\S+) disconnected, ((?:no longer )?(?:not )?authorised)\.$`), ""},
		{regexp.MustCompile(`^Client (\S+) (disconnected due to .*)\.$`), ""},
		{regexp.MustCompile(`^Client (\S+) (disconnected: .*)\.$`), ""},
		{regexp.MustCompile(`^Socket error on client (\S+), disconnecting\.$`), "socket error"},
		{regexp.MustCompile(`^Bad socket read/write on client (\S+): (.*)$`), ""},
	}
)

// ParseMosquittoLog reads one $SYS/broker/log/N payload ("<timestamp>: <message>", whatever
// log_timestamp_format says) and returns the broker observation it carries, if any: a client
// connected, or a client went and why. Lines about connections with no client ID yet ("<unknown>":
// a CONNECT refused before the broker knew the ID) and every other line give ok false. at is when
// the line was received.
func ParseMosquittoLog(payload string, at time.Time) (o Observation, ok bool) {
	line := strings.TrimSpace(payload)
	if _, msg, found := strings.Cut(line, ": "); found {
		line = msg
	}
	if m := connectLine.FindStringSubmatch(line); m != nil {
		return Observation{ClientID: m[1], Connected: true, At: at, Source: SourceBroker}, true
	}
	for _, l := range leaveLines {
		m := l.re.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		if m[1] == "<unknown>" {
			return Observation{}, false
		}
		reason := l.reason
		if reason == "" {
			reason = m[2]
		}
		return Observation{ClientID: m[1], At: at, Reason: reason, Source: SourceBroker}, true
	}
	return Observation{}, false
}
