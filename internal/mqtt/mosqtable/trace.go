package mosqtable

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
)

// traceCounts is what the broker asked the plugin between two control messages (Trace).
type traceCounts struct {
	auths  int
	checks map[acl.Access]int
}

// check counts one ACL check.
func (c *traceCounts) check(a acl.Access) {
	if c.checks == nil {
		c.checks = map[acl.Access]int{}
	}
	c.checks[a]++
}

// countAuth counts a CONNECT for Trace; it is always true (it sits in Authenticate's checks).
func (p *Plugin) countAuth() bool {
	if p.cfg.Trace != nil {
		p.traced.auths++
	}
	return true
}

// trace logs one control message and what came before it (Trace).
func (p *Plugin) trace(sender string, payload []byte, req Request, out []byte, took time.Duration) {
	ops := make([]string, 0, len(req.Commands))
	for _, c := range req.Commands {
		ops = append(ops, string(c.Op))
	}
	c := p.traced
	p.traced = traceCounts{}
	fmt.Fprintf(p.cfg.Trace, "%s a2a-fleet table trace: control from %s op=%s commands=%d [%s] in=%dB out=%dB took=%s; since the last: %d CONNECT, checks publish=%d receive=%d subscribe=%d unsubscribe=%d\n",
		time.Now().UTC().Format(time.RFC3339Nano), sender, req.Op, len(req.Commands), strings.Join(ops, ","), len(payload), len(out), took,
		c.auths, c.checks[acl.Publish], c.checks[acl.Receive], c.checks[acl.Subscribe], c.checks[acl.Unsubscribe])
}

// traceRound writes one disk round to w (Trace).
func traceRound(w io.Writer, n acl.Names, pages int, took time.Duration) {
	fmt.Fprintf(w, "%s a2a-fleet table trace: disk round roles=%d groups=%d clients=%d, %d page writes, took=%s\n", time.Now().UTC().Format(time.RFC3339Nano), len(n.Roles), len(n.Groups), len(n.Clients), pages, took)
}
