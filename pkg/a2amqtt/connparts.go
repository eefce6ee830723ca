package a2amqtt

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// handlerCalls runs a Conn's message handlers on the receive goroutine and remembers which one
// runs since when: a handler that blocks stalls every message of the connection, and Alive
// reports it.
type handlerCalls struct {
	log *slog.Logger
	// since is when the current handler call started (unix nanoseconds, 0 while idle), topic
	// the topic of its message.
	since atomic.Int64
	topic atomic.Pointer[string]
}

// call runs h with p, recovering a panic: a panic here would kill the process from inside
// autopaho.
func (w *handlerCalls) call(h func(*paho.Publish), p *paho.Publish) {
	topic := p.Topic
	w.topic.Store(&topic)
	w.since.Store(time.Now().UnixNano())
	defer func() {
		w.since.Store(0)
		if v := recover(); v != nil {
			w.log.Error("message handler panicked; message dropped", "topic", p.Topic, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
		}
	}()
	h(p)
}

// blocked reports a handler call that has been running for longer than stuck.
func (w *handlerCalls) blocked(stuck time.Duration) error {
	since := w.since.Load()
	if since == 0 {
		return nil
	}
	d := time.Since(time.Unix(0, since))
	if d <= stuck {
		return nil
	}
	topic := ""
	if t := w.topic.Load(); t != nil {
		topic = *t
	}
	return fmt.Errorf("mqtt receive loop blocked for %s in the handler of %s", d.Round(10*time.Millisecond), topic)
}

// heldMessages are the messages of a persistent session that arrived before any handler matched
// them (the broker sends queued messages right after CONNACK), oldest first, until a Subscribe
// claims them; bounded by heldMax and heldTTL. The Conn's mu guards it.
type heldMessages struct {
	log  *slog.Logger
	msgs []heldMessage
}

// hold keeps p, dropping what is too old or too many.
func (h *heldMessages) hold(p *paho.Publish) {
	now := time.Now()
	drop := 0
	for drop < len(h.msgs) && (now.Sub(h.msgs[drop].at) > heldTTL || len(h.msgs)-drop >= heldMax) {
		drop++
	}
	if drop > 0 {
		h.log.Warn("dropping messages no handler claimed since the session resumed", "count", drop, "oldest_topic", h.msgs[0].p.Topic)
		clear(h.msgs[:drop])
		h.msgs = h.msgs[drop:]
	}
	h.msgs = append(h.msgs, heldMessage{p: p, at: now})
}

// claim removes and returns the held messages whose topic matches filter (without its
// $share/{group}/ prefix), in arrival order.
func (h *heldMessages) claim(match string) []*paho.Publish {
	if len(h.msgs) == 0 {
		return nil
	}
	var mine []*paho.Publish
	kept := h.msgs[:0]
	for _, m := range h.msgs {
		if TopicMatches(match, m.p.Topic) {
			mine = append(mine, m.p)
		} else {
			kept = append(kept, m)
		}
	}
	clear(h.msgs[len(kept):])
	h.msgs = kept
	return mine
}

// resubscriber renews a connection's broker subscriptions after a reconnect that lost them, and
// keeps retrying the ones the broker refuses for as long as that connection lasts.
type resubscriber struct {
	log     *slog.Logger
	timeout time.Duration
	state   *ConnState
	closed  *atomic.Bool
	// subscribe sends one SUBSCRIBE (Conn.brokerSubscribe); wanted reports whether a handler
	// still wants filter.
	subscribe func(ctx context.Context, filter string) error
	wanted    func(filter string) bool
}

// renew subscribes filters again; refusals are retried in the background.
func (r *resubscriber) renew(ctx context.Context, filters []string) {
	var refused []string
	for _, f := range filters {
		if err := r.subscribe(ctx, f); err != nil {
			if errors.Is(err, errSubscribeRefused) {
				r.log.Debug("resubscribe refused after reconnecting; retrying", "filter", f, "err", err)
				refused = append(refused, f)
				continue
			}
			r.logError(f, err)
		}
	}
	if len(refused) > 0 {
		go r.retryRefused(refused)
	}
}

// retryRefused retries resubscribes the broker refused after a reconnect, for as long as this
// connection lasts. A refusal right after a reconnect is usually the broker's ACLs being
// rewritten in several steps (the operator applying an Agent's rights, or re-creating a whole
// broker state that was lost); it clears within seconds. Granting a right does not disconnect
// the client (the operator's ACL model never kicks anyone for a grant), so without these retries
// a client whose rights come back later would wait for ever. A refusal that persists past the
// first attempts is reported once, at WARN, and its end at INFO; the retries then continue at
// most every refusedRetryCap.
func (r *resubscriber) retryRefused(filters []string) {
	conn := r.state.connection()
	delay, waited, warned := time.Second, time.Duration(0), false
	for len(filters) > 0 {
		time.Sleep(delay)
		waited += delay
		if r.closed.Load() || !r.state.Up() || r.state.connection() != conn {
			return // the next reconnect resubscribes (and retries on its own)
		}
		var still []string
		for _, f := range filters {
			if !r.wanted(f) {
				continue // the caller unsubscribed meanwhile
			}
			ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
			err := r.subscribe(ctx, f)
			cancel()
			switch {
			case errors.Is(err, errSubscribeRefused):
				still = append(still, f)
				r.log.Debug("resubscribe still refused; retrying", "filter", f, "err", err)
			case err != nil:
				r.logError(f, err)
			case warned:
				r.log.Info("broker grants a subscription it refused after reconnecting", "filter", f, "refused_for", waited.Round(time.Second))
			}
		}
		filters = still
		if len(filters) > 0 && !warned && waited >= refusedWarnAfter {
			warned = true
			for _, f := range filters {
				r.logError(f, fmt.Errorf("subscribe %s: %w", f, errSubscribeRefused))
			}
		}
		delay = min(2*delay, refusedRetryCap)
	}
}

// logError: a SUBACK refusal (e.g. 0x87 not authorised: the ACLs changed while we were away) is
// a real problem; a connection that dropped again during the resubscribe is not (the next
// reconnect resubscribes).
func (r *resubscriber) logError(filter string, err error) {
	if errors.Is(err, errSubscribeRefused) {
		r.log.Warn("broker refuses a subscription after reconnecting: nothing arrives on it until the broker grants it (retried while connected)", "filter", filter, "err", err)
		return
	}
	r.log.Debug("resubscribe interrupted; retried on the next reconnect", "filter", filter, "err", err)
}
