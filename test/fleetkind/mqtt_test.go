package fleetkind

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// credentials are one Agent's broker identity.
type credentials struct {
	clientID, username, password string
}

// dialMQTT opens one MQTT v5 session (plain paho) and returns the client, the CONNACK's reason
// code (0x80 and above: refused) and an error when no CONNACK came.
func dialMQTT(ctx context.Context, addr string, c credentials, onPublish func(*paho.Publish)) (*paho.Client, byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, 0, err
	}
	cfg := paho.ClientConfig{ClientID: c.clientID, Conn: conn}
	if onPublish != nil {
		cfg.OnPublishReceived = []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			onPublish(pr.Packet)
			return true, nil
		}}
	}
	pc := paho.NewClient(cfg)
	ca, err := pc.Connect(ctx, &paho.Connect{ClientID: c.clientID, KeepAlive: 30, CleanStart: true,
		Username: c.username, UsernameFlag: true, Password: []byte(c.password), PasswordFlag: true})
	if ca != nil && ca.ReasonCode >= 0x80 {
		_ = conn.Close()
		return nil, ca.ReasonCode, nil
	}
	if err != nil {
		_ = conn.Close()
		return nil, 0, err
	}
	return pc, 0, nil
}

// fleetClients keeps n sessions connected, each reconnecting 100 ms after it lost its session,
// and counts how many are up.
type fleetClients struct {
	up        atomic.Int64
	mu        sync.Mutex
	lastUp    map[int]time.Time // when each client's current session started
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	connected []atomic.Bool
}

func startFleetClients(ctx context.Context, addr string, creds []credentials) *fleetClients {
	ctx, cancel := context.WithCancel(ctx)
	f := &fleetClients{lastUp: map[int]time.Time{}, cancel: cancel, connected: make([]atomic.Bool, len(creds))}
	for i, c := range creds {
		f.wg.Go(func() {
			// Spread the first CONNECTs over a second, as a fleet's pods start.
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Duration(i%1000) * time.Millisecond):
			}
			for ctx.Err() == nil {
				pc, _, _ := dialMQTT(ctx, addr, c, nil)
				if pc == nil {
					select {
					case <-ctx.Done():
						return
					case <-time.After(100 * time.Millisecond):
					}
					continue
				}
				f.mu.Lock()
				f.lastUp[i] = time.Now()
				f.mu.Unlock()
				f.connected[i].Store(true)
				f.up.Add(1)
				select {
				case <-ctx.Done():
					_ = pc.Disconnect(&paho.Disconnect{})
				case <-pc.Done():
				}
				f.connected[i].Store(false)
				f.up.Add(-1)
				select {
				case <-ctx.Done():
					return
				case <-time.After(100 * time.Millisecond):
				}
			}
		})
	}
	return f
}

// lastReconnect is the latest session start of any client.
func (f *fleetClients) lastReconnect() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	var last time.Time
	for _, t := range f.lastUp {
		if t.After(last) {
			last = t
		}
	}
	return last
}

func (f *fleetClients) stop() {
	f.cancel()
	f.wg.Wait()
}

// probeCounts is what the enforcement prober saw.
type probeCounts struct {
	connects, connectsRefused  atomic.Int64
	wrongPasswordAccepted      atomic.Int64
	wrongPasswordTried         atomic.Int64
	refusedTopicAccepted       atomic.Int64
	refusedTopicTried          atomic.Int64
	allowedAccepted            atomic.Int64
	firstEnforcedAfter         atomic.Int64 // unix nanos of the first refused publish seen after arm
	firstAllowedAfter          atomic.Int64 // unix nanos of the first allowed publish accepted after arm
	armed                      atomic.Int64 // unix nanos; 0: not armed
	connectErrors, publishErrs atomic.Int64
}

// prober checks, in a loop, that the broker enforces the table: a CONNECT with a wrong password is
// refused, and a connected Agent's QoS 1 PUBLISH to a topic the table refuses it is refused
// (PUBACK 0x87), while one it grants is accepted.
func prober(ctx context.Context, addr string, who credentials, refusedTopic, allowedTopic string, counts *probeCounts) func() {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		wrong := who
		wrong.password = "not-" + who.password
		for ctx.Err() == nil {
			counts.wrongPasswordTried.Add(1)
			if pc, _, _ := dialMQTT(ctx, addr, wrong, nil); pc != nil {
				counts.wrongPasswordAccepted.Add(1)
				_ = pc.Disconnect(&paho.Disconnect{})
			}
			select {
			case <-ctx.Done():
			case <-time.After(250 * time.Millisecond):
			}
		}
	})
	wg.Go(func() {
		for ctx.Err() == nil {
			pc, rc, err := dialMQTT(ctx, addr, who, nil)
			if pc == nil {
				if err != nil {
					counts.connectErrors.Add(1)
				} else if rc >= 0x80 {
					counts.connectsRefused.Add(1)
				}
				select {
				case <-ctx.Done():
				case <-time.After(50 * time.Millisecond):
				}
				continue
			}
			counts.connects.Add(1)
			// Only a session begun after the arming (the broker pod's deletion) says when the
			// new broker enforces.
			armed := counts.armed.Load()
			fresh := armed != 0 && time.Now().UnixNano() > armed
			for ctx.Err() == nil {
				pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
				res, err := pc.Publish(pctx, &paho.Publish{Topic: refusedTopic, QoS: 1, Payload: []byte("probe")})
				pcancel()
				if err != nil && res == nil {
					counts.publishErrs.Add(1)
					break
				}
				counts.refusedTopicTried.Add(1)
				if res.ReasonCode < 0x80 {
					counts.refusedTopicAccepted.Add(1)
				} else if fresh {
					counts.firstEnforcedAfter.CompareAndSwap(0, time.Now().UnixNano())
				}
				pctx, pcancel = context.WithTimeout(ctx, 5*time.Second)
				res, err = pc.Publish(pctx, &paho.Publish{Topic: allowedTopic, QoS: 1, Payload: []byte("probe")})
				pcancel()
				if err != nil && res == nil {
					counts.publishErrs.Add(1)
					break
				}
				if res.ReasonCode < 0x80 {
					counts.allowedAccepted.Add(1)
					if fresh {
						counts.firstAllowedAfter.CompareAndSwap(0, time.Now().UnixNano())
					}
				}
				select {
				case <-ctx.Done():
				case <-pc.Done():
				case <-time.After(50 * time.Millisecond):
					continue
				}
				break
			}
			_ = pc.Disconnect(&paho.Disconnect{})
		}
	})
	return func() { cancel(); wg.Wait() }
}
