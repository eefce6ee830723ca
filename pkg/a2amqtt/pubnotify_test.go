package a2amqtt

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
)

// notified collects the outcomes PublishNotify reports.
type notified struct {
	mu    sync.Mutex
	calls int
	resp  *paho.PublishResponse
	err   error
	done  chan struct{}
}

func newNotified() *notified { return &notified{done: make(chan struct{})} }

func (n *notified) report(resp *paho.PublishResponse, err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.calls++
	n.resp, n.err = resp, err
	if n.calls == 1 {
		close(n.done)
	}
}

func (n *notified) wait(t *testing.T, d time.Duration) (*paho.PublishResponse, error) {
	t.Helper()
	select {
	case <-n.done:
	case <-time.After(d):
		t.Fatalf("PublishNotify's done not called within %s", d)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.resp, n.err
}

func (n *notified) count() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.calls
}

// TestPublishNotify: the broker's PUBACK reaches done exactly once, with its
// reason code (0x10 when nobody reads the topic), for every one of many
// concurrent publishes, and the message is delivered.
func TestPublishNotify(t *testing.T) {
	brokertest.ForEach(t, func(t *testing.T, b brokertest.Broker) {
		ctx := ctxT(t, 30*time.Second)
		pub := connectT(t, b, AgentRef{Org: "o", Unit: "u", Agent: "notify-pub"}, nil)
		sub := connectT(t, b, AgentRef{Org: "o", Unit: "u", Agent: "notify-sub"}, nil)
		got := make(chan string, 1024)
		if _, err := sub.Subscribe(ctx, "test/notify/read", func(p *paho.Publish) { got <- string(p.Payload) }); err != nil {
			t.Fatal(err)
		}

		// A publish before any message was received: no live client is
		// known yet, so it goes the synchronous way and reports before
		// PublishNotify returns.
		first := newNotified()
		if err := pub.PublishNotify(ctx, &paho.Publish{Topic: "test/notify/read", QoS: 1, Payload: []byte("first")}, first.report); err != nil {
			t.Fatal(err)
		}
		if resp, err := first.wait(t, 5*time.Second); err != nil || resp == nil || resp.ReasonCode != 0 {
			t.Fatalf("first publish: resp %+v err %v, want reason 0", resp, err)
		}
		<-got

		// Many at once from several goroutines: each hears its own PUBACK once.
		const goroutines, each = 8, 50
		var wg sync.WaitGroup
		ns := make([]*notified, goroutines*each)
		for g := range goroutines {
			wg.Go(func() {
				for i := range each {
					n := newNotified()
					ns[g*each+i] = n
					if err := pub.PublishNotify(ctx, &paho.Publish{Topic: "test/notify/read", QoS: 1, Payload: []byte("x")}, n.report); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		for i, n := range ns {
			resp, err := n.wait(t, 10*time.Second)
			if err != nil || resp == nil || resp.ReasonCode != 0 {
				t.Fatalf("publish %d: resp %+v err %v, want reason 0", i, resp, err)
			}
		}
		for range ns {
			select {
			case <-got:
			case <-time.After(10 * time.Second):
				t.Fatal("a notified publish was not delivered")
			}
		}

		// Nobody reads this topic: Mosquitto says so in the PUBACK (mochi
		// answers success either way).
		wantUnread := byte(0x10)
		if b.Name() == "mochi" {
			wantUnread = 0
		}
		unread := newNotified()
		if err := pub.PublishNotify(ctx, &paho.Publish{Topic: "test/notify/unread", QoS: 1, Payload: []byte("y")}, unread.report); err != nil {
			t.Fatal(err)
		}
		if resp, err := unread.wait(t, 5*time.Second); err != nil || resp == nil || resp.ReasonCode != wantUnread {
			t.Fatalf("unread publish: resp %+v err %v, want reason 0x%02x", resp, err, wantUnread)
		}

		time.Sleep(100 * time.Millisecond)
		for i, n := range append(ns, first, unread) {
			if c := n.count(); c != 1 {
				t.Fatalf("publish %d: done called %d times, want once", i, c)
			}
		}
		pub.acks.n.mu.Lock()
		left := len(pub.acks.n.pending)
		pub.acks.n.mu.Unlock()
		if left != 0 {
			t.Fatalf("%d notices still pending after every PUBACK arrived", left)
		}
		if err := pub.PublishNotify(ctx, &paho.Publish{Topic: "test/notify/read", QoS: 0}, first.report); err == nil {
			t.Fatal("PublishNotify accepted QoS 0")
		}
	})
}

// TestPublishNotifyDropped: a message whose PUBACK never comes is reported
// as dropped when the broker does not resume the session (a clean session
// after the broker restarted) and when the connection is closed; nothing is
// reported twice.
func TestPublishNotifyDropped(t *testing.T) {
	m := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{})
	t.Cleanup(m.Resume)
	ctx := ctxT(t, 60*time.Second)
	var reconnected atomic.Bool
	conn := func(name string) *Conn {
		c, err := Connect(ctx, Config{BrokerURL: m.URL(), Agent: AgentRef{Org: "o", Unit: "u", Agent: name}, Logger: testLogger(t), KeepAlive: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		return c
	}
	pub := conn("dropped-pub")
	// A delivered message makes the client live (PublishNotify then sends
	// without waiting).
	if _, err := pub.Subscribe(ctx, "test/notify/self", func(*paho.Publish) { reconnected.Store(true) }); err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(ctx, &paho.Publish{Topic: "test/notify/self", QoS: 1}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "own message", reconnected.Load)

	// Restart: the frozen broker never answers; the new one has no session.
	m.Pause()
	lost := newNotified()
	if err := pub.PublishNotify(ctx, &paho.Publish{Topic: "test/notify/self", QoS: 1, Payload: []byte("lost")}, lost.report); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if c := lost.count(); c != 0 {
		t.Fatalf("done called %d times while the broker was frozen", c)
	}
	m.Kill()
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	if _, err := lost.wait(t, 30*time.Second); !errors.Is(err, ErrDroppedFromSession) {
		t.Fatalf("after a restart without the session: err %v, want ErrDroppedFromSession", err)
	}
	if err := pub.cm.AwaitConnection(ctx); err != nil {
		t.Fatal(err)
	}

	// Close while a PUBACK is outstanding.
	reconnected.Store(false)
	waitFor(t, 10*time.Second, "own message after the restart (resubscribed)", func() bool {
		if _, err := pub.Publish(ctx, &paho.Publish{Topic: "test/notify/self", QoS: 1}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
		return reconnected.Load()
	})
	m.Pause()
	closed := newNotified()
	if err := pub.PublishNotify(ctx, &paho.Publish{Topic: "test/notify/self", QoS: 1, Payload: []byte("closed")}, closed.report); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_ = pub.Close(cctx)
	if _, err := closed.wait(t, 10*time.Second); !errors.Is(err, ErrDroppedFromSession) {
		t.Fatalf("after Close: err %v, want ErrDroppedFromSession", err)
	}
	m.Resume()
	time.Sleep(100 * time.Millisecond)
	if lost.count() != 1 || closed.count() != 1 {
		t.Fatalf("done calls: lost %d, closed %d; want 1 each", lost.count(), closed.count())
	}
}
