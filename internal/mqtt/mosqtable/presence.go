package mosqtable

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/presence"
)

// UnseenDisconnectReason is the reason given for a client the operator believed connected that
// is not in the plugin's live set when the operator reads it again (after its admin connection
// came back, e.g. across a broker restart): its disconnect happened while nobody was listening.
const UnseenDisconnectReason = "not connected when the operator read the broker's live set again (the broker restarted, or the disconnect happened while the operator's connection was down)"

// presenceView is the operator's copy of the plugin's live set, fed by its events on
// PresenceTopic and corrected by an OpPresence answer at every (re)connection. Both arrive on
// the admin connection's one message goroutine, in the broker's order.
type presenceView struct {
	// read is closed once the first OpPresence exchange ended (answered or not).
	read     chan struct{}
	readOnce sync.Once

	mu       sync.Mutex
	live     map[string]time.Time // client ID → connected since
	watchers []func(presence.Observation)
}

// WatchPresence implements presence.Source: every connect, disconnect and refused CONNECT the
// plugin reports from now on goes to fn (on the admin connection's goroutine; fn must not
// block), and the clients connected now are returned. On an opened backend it first waits
// (at most ConnectTimeout) for the admin connection's first read of the plugin's live set, so
// a new operator starts from the broker's truth instead of calling every connected agent
// NotConnected until then; a set read later is reported to fn.
func (b *Backend) WatchPresence(fn func(presence.Observation)) []presence.Observation {
	v := &b.presence
	if b.sess.Load() != nil {
		wait := time.NewTimer(b.cfg.ConnectTimeout)
		select {
		case <-v.read:
		case <-wait.C:
			b.log.Info("the broker's live connections are not read yet; presence follows once they are", "waited", b.cfg.ConnectTimeout)
		}
		wait.Stop()
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.watchers = append(v.watchers, fn)
	out := make([]presence.Observation, 0, len(v.live))
	for id, since := range v.live {
		out = append(out, presence.Observation{ClientID: id, Connected: true, At: since, Source: presence.SourceBroker})
	}
	return out
}

// presenceEvent applies one PresenceTopic message.
func (b *Backend) presenceEvent(p *paho.Publish) {
	o, err := presence.ParsePluginEvent(p.Payload, time.Now())
	if err != nil {
		b.log.Warn("unreadable presence event from the decision table plugin", "err", err)
		return
	}
	v := &b.presence
	v.mu.Lock()
	switch {
	case o.Connected:
		if v.live == nil {
			v.live = map[string]time.Time{}
		}
		v.live[o.ClientID] = o.At
	case !o.Refused:
		delete(v.live, o.ClientID)
	}
	watchers := slices.Clone(v.watchers)
	v.mu.Unlock()
	for _, fn := range watchers {
		fn(o)
	}
}

// replacePresence makes the view the plugin's live set: who is gone is reported disconnected,
// who connected (again) since is reported connected.
func (b *Backend) replacePresence(set LiveSet) {
	v := &b.presence
	var out []presence.Observation
	v.mu.Lock()
	now := make(map[string]time.Time, len(set.Clients))
	for _, c := range set.Clients {
		now[c.ClientID] = c.Since
	}
	for id := range v.live {
		if _, ok := now[id]; !ok {
			out = append(out, presence.Observation{ClientID: id, At: set.At, Reason: UnseenDisconnectReason, Source: presence.SourceBroker})
		}
	}
	for id, since := range now {
		if was, ok := v.live[id]; !ok || !was.Equal(since) {
			out = append(out, presence.Observation{ClientID: id, Connected: true, At: since, Source: presence.SourceBroker})
		}
	}
	v.live = now
	watchers := slices.Clone(v.watchers)
	v.mu.Unlock()
	for _, fn := range watchers {
		for _, o := range out {
			fn(o)
		}
	}
}

// readPresence asks the plugin for its live set; the answer is applied where it is received
// (dispatch), in order with the events around it.
func (b *Backend) readPresence(ctx context.Context) {
	resp, err := b.request(ctx, Request{Op: OpPresence})
	defer b.presence.readOnce.Do(func() { close(b.presence.read) })
	switch {
	case err != nil:
		b.log.Info("could not read the broker's live connections; presence follows the plugin's events only", "err", err)
	case resp.Error != "":
		b.log.Info("the decision table plugin does not report its live connections (an older plugin?); presence follows its events only", "err", resp.Error)
	}
}
