package a2amqtt

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/google/uuid"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
)

// TestInFlightPublishIsSentAgainAfterAConnectionLoss, on both brokers: a QoS 1 message of a
// clean session that the connection takes down with it before its PUBACK (here the relay
// swallows it, then the connection is cut; in the field, the broker kicks the client after a
// credentials rotation) reaches its subscriber once the connection is back, and Publish
// returns without error. paho drops such a message from a session that is not resumed, and
// Publish used to wait out paho's 10 s packet timeout and fail: a responder's reply was lost
// that way at the kick of a rotation (TestRotationUnderLoad on Mosquitto, 1-2 requests in
// some runs).
func TestInFlightPublishIsSentAgainAfterAConnectionLoss(t *testing.T) {
	brokertest.ForEach(t, func(t *testing.T, b brokertest.Broker) {
		ctx := ctxT(t, 30*time.Second)
		rl := startRelay(t, b.Addr())
		sub := brokertest.MustDial(t, b.Addr(), brokertest.Options{ClientID: "inflight-sub"})
		sub.Subscribe("inflight/test")
		conn, err := Connect(ctx, Config{BrokerURL: "mqtt://" + rl.addr(), Agent: AgentRef{Org: "acme", Unit: "ops", Agent: "inflight"}, Logger: testLogger(t), KeepAlive: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close(context.Background()) })

		rl.hold()
		done := make(chan error, 1)
		go func() {
			_, err := conn.Publish(ctx, &paho.Publish{Topic: "inflight/test", QoS: 1, Payload: []byte("m1")})
			done <- err
		}()
		// The PUBLISH itself, not whatever the connection sent first (on mochi the SDK's own
		// packets after the CONNACK can still be on their way: the cut then came before the
		// PUBLISH, which went into the next connection's session through the old client, and
		// waited out paho's packet timeout: ci).
		waitFor(t, 5*time.Second, "the PUBLISH written to the relay", func() bool { return rl.swallowedPublishes() > 0 })
		rl.cut()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Publish: %v (want the message sent again on the next connection)", err)
			}
		case <-time.After(8 * time.Second):
			t.Fatal("Publish still waiting 8 s after the connection was cut (paho's packet timeout is 10 s): the message was dropped with the session")
		}
		sub.Expect("inflight/test", "m1")
	})
}

// TestDrainAnswersWhatArrivedBeforeTheUnsubscribe, on both brokers: a clean-session responder
// that drains while requests keep coming answers every request its connection was given, with
// its result or with -32004, before Shutdown returns: none is left in paho's queue to the
// handlers when the connection closes (paho reads the UNSUBACK while requests the broker sent
// before it may still wait in that queue). Requests come without retries, from two publishers,
// while Shutdown runs.
func TestDrainAnswersWhatArrivedBeforeTheUnsubscribe(t *testing.T) {
	brokertest.ForEach(t, func(t *testing.T, b brokertest.Broker) {
		req := connectT(t, b, AgentRef{Org: "acme", Unit: "ops", Agent: "drain-req"}, nil)
		replyTopic := req.Agent().ReplyTopic("r")
		var mu sync.Mutex
		answered := map[string]bool{}
		if _, err := req.Subscribe(ctxT(t, 5*time.Second), replyTopic, func(m *paho.Publish) {
			mu.Lock()
			answered[string(m.Properties.CorrelationData)] = true
			mu.Unlock()
		}); err != nil {
			t.Fatal(err)
		}
		for round := range 6 {
			ref := AgentRef{Org: "acme", Unit: "ops", Agent: fmt.Sprintf("drainer-%d", round)}
			conn := connectT(t, b, ref, testCard(ref))
			resp, err := NewResponder(ctxT(t, 10*time.Second), conn, ResponderOptions{Executor: echoExec()})
			if err != nil {
				t.Fatal(err)
			}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var sent atomic.Int64
			var stopOnce sync.Once
			halt := func() { stopOnce.Do(func() { close(stop) }); wg.Wait() }
			t.Cleanup(halt)
			for w := range 2 {
				wg.Go(func() {
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						corr := fmt.Sprintf("%d-%d-%d", round, w, i)
						_ = req.PublishAsync(ctxT(t, 5*time.Second), &paho.Publish{Topic: ref.RequestTopic(), QoS: 1,
							Payload:    sendReq(MethodSendMessage, uuid.NewString(), "", corr),
							Properties: &paho.PublishProperties{ResponseTopic: replyTopic, CorrelationData: []byte(corr)}})
						sent.Add(1)
					}
				})
			}
			waitFor(t, 10*time.Second, "requests flowing", func() bool { return conn.dispatched.Load() >= uint64(20+round*10) })
			if err := resp.Shutdown(ctxT(t, 20*time.Second)); err != nil {
				t.Fatalf("round %d: Shutdown: %v", round, err)
			}
			_ = conn.Close(context.Background())
			halt()
			delivered := conn.acks.delivered.Load()
			count := func() int {
				mu.Lock()
				defer mu.Unlock()
				n := 0
				for c := range answered {
					if strings.HasPrefix(c, fmt.Sprintf("%d-", round)) {
						n++
					}
				}
				return n
			}
			deadline := time.Now().Add(3 * time.Second)
			for uint64(count()) < delivered && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			if got := count(); uint64(got) != delivered {
				t.Fatalf("round %d: %d requests delivered to the responder, %d answered (of %d sent)", round, delivered, got, sent.Load())
			}
			t.Logf("round %d: %d requests sent, %d delivered before the drain ended, all answered", round, sent.Load(), delivered)
		}
	})
}

// relay forwards TCP connections to a broker. hold makes it swallow what clients write (the
// broker never sees it); cut closes every connection it carries and forwards again.
type relay struct {
	ln      net.Listener
	target  string
	mu      sync.Mutex
	holding bool
	eaten   int
	// publishes counts the PUBLISH packets among what it swallowed (a chunk read from the
	// client is read as whole packets: small ones on loopback).
	publishes int
	conns     []net.Conn
}

// countPublishes returns the PUBLISH packets in chunk, read as a sequence of whole MQTT packets.
func countPublishes(chunk []byte) int {
	n := 0
	for len(chunk) >= 2 {
		if chunk[0]>>4 == 3 {
			n++
		}
		length, shift, i := 0, 0, 1
		for ; i < len(chunk) && i <= 4; i++ {
			length |= int(chunk[i]&0x7f) << shift
			shift += 7
			if chunk[i]&0x80 == 0 {
				break
			}
		}
		next := i + 1 + length
		if next > len(chunk) {
			break
		}
		chunk = chunk[next:]
	}
	return n
}

func startRelay(t *testing.T, target string) *relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{ln: ln, target: target}
	t.Cleanup(func() { _ = ln.Close(); r.cut() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			r.mu.Lock()
			r.conns = append(r.conns, c, up)
			r.mu.Unlock()
			go func() { _, _ = copyConn(up, c, r); _ = up.Close(); _ = c.Close() }()
			go func() { _, _ = copyConn(c, up, nil); _ = up.Close(); _ = c.Close() }()
		}
	}()
	return r
}

// copyConn copies src to dst; with a relay, what arrives while it holds is swallowed.
func copyConn(dst, src net.Conn, r *relay) (int, error) {
	buf := make([]byte, 32*1024)
	total := 0
	for {
		n, err := src.Read(buf)
		if n > 0 {
			swallow := false
			if r != nil {
				r.mu.Lock()
				if r.holding {
					r.eaten += n
					r.publishes += countPublishes(buf[:n])
					swallow = true
				}
				r.mu.Unlock()
			}
			if !swallow {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return total, werr
				}
				total += n
			}
		}
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return total, nil
			}
			return total, err
		}
	}
}

func (r *relay) addr() string { return r.ln.Addr().String() }

func (r *relay) hold() {
	r.mu.Lock()
	r.holding = true
	r.mu.Unlock()
}

func (r *relay) swallowed() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.eaten
}

func (r *relay) swallowedPublishes() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.publishes
}

func (r *relay) cut() {
	r.mu.Lock()
	conns := r.conns
	r.conns, r.holding = nil, false
	r.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}
