package registration_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	jose "github.com/go-jose/go-jose/v4"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt/cardsig"
	"github.com/a2a-fleet/a2a-fleet/test/testenv"
)

// cardReader is a plain paho v5 client that reads the card keys and every card of org acme and
// verifies each card the moment it arrives, against the keys it holds then: the live keys from
// the retained topic (live), and, when pinned is set, a fixed key set too (a client that cached
// the keys before a rotation). When new keys arrive, it verifies again every card it holds.
type cardReader struct {
	pc *paho.Client

	mu        sync.Mutex
	keys      *jose.JSONWebKeySet
	pinned    *jose.JSONWebKeySet
	kids      map[string]string // topic → kids of its last card
	last      map[string][]byte // topic → its last card
	cards     int
	failures  []string // live
	pinnedOK  bool     // pinned set still expected to verify
	pinnedBad []string
}

func dialCardReader(t *testing.T, b *runtimeBroker, clientID string, pinned *jose.JSONWebKeySet) *cardReader {
	t.Helper()
	r := &cardReader{pinned: pinned, pinnedOK: pinned != nil, kids: map[string]string{}, last: map[string][]byte{}}
	conn, err := net.Dial("tcp", b.addr)
	if err != nil {
		t.Fatal(err)
	}
	r.pc = paho.NewClient(paho.ClientConfig{ClientID: clientID, Conn: conn,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			r.receive(pr.Packet)
			return true, nil
		}}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ca, err := r.pc.Connect(ctx, &paho.Connect{ClientID: clientID, CleanStart: true, KeepAlive: 30,
		UsernameFlag: true, Username: b.adminUser, PasswordFlag: true, Password: []byte(b.adminPass)})
	if err != nil || ca.ReasonCode != 0 {
		t.Fatalf("card reader connect: %v %v", ca, err)
	}
	t.Cleanup(func() { _ = r.pc.Disconnect(&paho.Disconnect{}) })
	// Keys first, then the cards: every card arrives after the keys that signed it.
	for _, f := range []string{a2amqtt.CardKeysTopic, a2amqtt.DirectoryFilter("acme")} {
		sa, err := brokertest.SubscribeRetrying(ctx, r.pc, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: f, QoS: 1}}})
		if err != nil || sa.Reasons[0] >= 0x80 {
			t.Fatalf("card reader subscribe %s: %v %v", f, sa, err)
		}
		if f == a2amqtt.CardKeysTopic {
			eventually(t, "the card reader has the keys", func() error {
				r.mu.Lock()
				defer r.mu.Unlock()
				if r.keys == nil {
					return errors.New("no keys yet")
				}
				return nil
			})
		}
	}
	return r
}

func (r *cardReader) receive(p *paho.Publish) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p.Topic == a2amqtt.CardKeysTopic {
		set, err := cardsig.ParseKeySet(p.Payload)
		if err != nil {
			r.failures = append(r.failures, "unreadable key set: "+err.Error())
			return
		}
		r.keys = set
		// Every card the reader holds must verify with the new keys too: the retained cards do
		// not come again when the keys change.
		for topic, card := range r.last {
			if _, err := cardsig.Verify(card, set); err != nil {
				r.failures = append(r.failures, fmt.Sprintf("%s, held, with the new keys %s: %v", topic, setKids(set), err))
			}
		}
		return
	}
	if len(p.Payload) == 0 {
		r.failures = append(r.failures, "card cleared on "+p.Topic)
		return
	}
	r.cards++
	r.kids[p.Topic] = kidsOf(p.Payload)
	r.last[p.Topic] = p.Payload
	if _, err := cardsig.Verify(p.Payload, r.keys); err != nil {
		r.failures = append(r.failures, fmt.Sprintf("%s: %v (keys %s)", p.Topic, err, setKids(r.keys)))
	}
	if r.pinnedOK {
		if _, err := cardsig.Verify(p.Payload, r.pinned); err != nil {
			r.pinnedBad = append(r.pinnedBad, fmt.Sprintf("%s: %v", p.Topic, err))
		}
	}
}

// state is what the reader holds now: the kids of the key set and how many cards carry each
// kid set.
func (r *cardReader) state() (keys string, byKids map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	byKids = map[string]int{}
	for _, k := range r.kids {
		byKids[k]++
	}
	return setKids(r.keys), byKids
}

func kidsOf(card []byte) string {
	var c struct {
		Signatures []struct{ Protected string } `json:"signatures"`
	}
	_ = json.Unmarshal(card, &c)
	var kids []string
	for _, s := range c.Signatures {
		raw, _ := base64.RawURLEncoding.DecodeString(s.Protected)
		var h struct{ Kid string }
		if json.Unmarshal(raw, &h) == nil && h.Kid != "" {
			kids = append(kids, h.Kid)
		}
	}
	return joinSorted(kids)
}

func setKids(s *jose.JSONWebKeySet) string {
	if s == nil {
		return ""
	}
	var kids []string
	for _, k := range s.Keys {
		kids = append(kids, k.KeyID)
	}
	return joinSorted(kids)
}

func joinSorted(s []string) string {
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return strings.Join(s, ",")
}

// pollCards reads the retained keys, then every retained card, with a fresh connection, and
// verifies each card against those keys: the view of a client that starts at this moment.
func pollCards(t *testing.T, b *runtimeBroker, n int) error {
	t.Helper()
	r := dialCardReader(t, b, "poll-"+strconv.FormatInt(time.Now().UnixNano(), 36), nil)
	deadline := time.Now().Add(20 * time.Second)
	for {
		r.mu.Lock()
		cards, failures := r.cards, append([]string(nil), r.failures...)
		r.mu.Unlock()
		if len(failures) > 0 {
			return fmt.Errorf("%d of %d cards did not verify: %s", len(failures), cards, strings.Join(failures[:min(3, len(failures))], "; "))
		}
		if cards >= n {
			_ = r.pc.Disconnect(&paho.Disconnect{})
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d retained cards read", cards, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A key rotation of a fleet: a new key is added to the Secret (every card is signed again with
// both keys; the key set holds both before any card carries the new one), then the old key is
// retired (every card signed by the new key alone; the old key leaves the key set only after
// that), then that key is replaced by a third one in place, without overlap (the key set holds
// both until every card carries the third). A reader that follows the retained keys verifies every card message it receives
// throughout, a client that cached the old keys keeps verifying until the old key is retired,
// and a client that starts at any moment (a fresh connection, keys then cards) verifies every
// card. No card is ever unsigned or cleared. Fleet size: CARD_ROTATION_AGENTS (default 50).
func TestCardKeyRotation(t *testing.T) {
	n := 50
	if v, err := strconv.Atoi(os.Getenv("CARD_ROTATION_AGENTS")); err == nil && v > 0 {
		n = v
	}
	forRuntimeBrokers(t, func(t *testing.T, b *runtimeBroker) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		ns, _ := startSigningOperator(t, ctx, b, "rotate-")
		agents := createAgents(t, ctx, ns, "rot", n)
		testenv.Eventually(t, time.Duration(n/5+60)*time.Second, "every card published", func() error {
			var list a2av1.AgentList
			if err := k8s.List(ctx, &list, client.InNamespace(ns)); err != nil {
				return err
			}
			published := 0
			for _, a := range list.Items {
				if a.Status.PublishedCardDigest != "" {
					published++
				}
			}
			if published < len(agents) {
				return fmt.Errorf("%d of %d cards published", published, len(agents))
			}
			return nil
		})

		secretKey := client.ObjectKey{Namespace: ns, Name: cardKeysSecret}
		secret := &corev1.Secret{}
		if err := k8s.Get(ctx, secretKey, secret); err != nil {
			t.Fatal(err)
		}
		var oldName string
		var oldKey *cardsig.Key
		for name, data := range secret.Data {
			oldName = name
			oldKey, _ = cardsig.ParseKeyPEM(data)
		}
		oldSet := cardsig.KeySet(oldKey)
		live := dialCardReader(t, b, "live-reader", &oldSet)
		waitCards(t, b, live, n, oldKey.ID, oldKey.ID, true)

		// 1. Add the new key: the overlap begins.
		newKey := mustNewKey(t)
		pemBytes, _ := newKey.PEM()
		secret.Data["next.pem"] = pemBytes
		if err := k8s.Update(ctx, secret); err != nil {
			t.Fatal(err)
		}
		both := joinSorted([]string{oldKey.ID, newKey.ID})
		waitCards(t, b, live, n, both, both, true)
		// The overlap window: a client with the cached old keys still verifies every card.
		if err := pollCards(t, b, n); err != nil {
			t.Fatalf("during the overlap: %v", err)
		}
		live.mu.Lock()
		pinnedBad := live.pinnedBad
		live.pinnedOK = false // retiring the old key ends what the cached keys can verify
		live.mu.Unlock()
		if len(pinnedBad) > 0 {
			t.Fatalf("a client with the cached old keys failed during the overlap: %v", pinnedBad[:min(3, len(pinnedBad))])
		}

		// 2. Retire the old key.
		if err := k8s.Get(ctx, secretKey, secret); err != nil {
			t.Fatal(err)
		}
		delete(secret.Data, oldName)
		if err := k8s.Update(ctx, secret); err != nil {
			t.Fatal(err)
		}
		waitCards(t, b, live, n, newKey.ID, newKey.ID, true)

		// 3. A replacement without overlap (a certificate manager that renews the key in place):
		// the old key stays in the key set until every card carries the new one, so a client that
		// follows the key set still verifies every card. Only the live reader looks meanwhile: a
		// client that subscribes while the cards are being signed again may get a retained copy
		// after the newer one (the broker sends the retained cards of a new subscription beside
		// live ones), which the old key no longer verifies once it is retired; with an overlap
		// that copy carries the new key's signature too (docs/security.md).
		if err := k8s.Get(ctx, secretKey, secret); err != nil {
			t.Fatal(err)
		}
		third := mustNewKey(t)
		pemBytes, _ = third.PEM()
		secret.Data = map[string][]byte{"tls.key": pemBytes}
		if err := k8s.Update(ctx, secret); err != nil {
			t.Fatal(err)
		}
		waitCards(t, b, live, n, third.ID, third.ID, false)
		if err := pollCards(t, b, n); err != nil {
			t.Fatalf("after the replacement: %v", err)
		}

		live.mu.Lock()
		defer live.mu.Unlock()
		if len(live.failures) > 0 {
			t.Fatalf("%d card messages did not verify with the keys retained at that moment: %v", len(live.failures), live.failures[:min(5, len(live.failures))])
		}
		// Every card was published signed by the old key, by both, by the new one, by the third.
		if live.cards < 4*n {
			t.Fatalf("the live reader saw %d card messages, want at least %d", live.cards, 4*n)
		}
		t.Logf("%s: %d agents, %d card messages verified live, 0 failures", b.name, n, live.cards)
	})
}

// waitCards waits until the live reader holds key set wantKeys and all n cards carry wantKids;
// with poll, it reads every card with a fresh connection (pollCards) at each look.
func waitCards(t *testing.T, b *runtimeBroker, live *cardReader, n int, wantKeys, wantKids string, poll bool) {
	t.Helper()
	polls := 0
	testenv.Eventually(t, time.Duration(n/10+60)*time.Second, "cards signed by "+wantKids, func() error {
		if poll {
			if err := pollCards(t, b, n); err != nil {
				t.Fatalf("a fresh reader (poll %d): %v", polls, err)
			}
			polls++
		}
		keys, byKids := live.state()
		if keys != wantKeys || byKids[wantKids] != n {
			return fmt.Errorf("keys %s, cards by kids %v", keys, byKids)
		}
		return nil
	})
}
