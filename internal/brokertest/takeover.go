package brokertest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// TakeoverLosses publishes n QoS 1 messages on topic as publisher, each while a new connection
// of subscriber (a persistent session, subscribed to topic once at the start) takes the session
// over, and returns the messages no connection of the session received within 10 s of the
// last publish, and how many arrived more than once (QoS 1 allows it). A broker that keeps a
// session's messages across take-overs loses none (package sessionhandover).
func TakeoverLosses(t testing.TB, addr, topic string, subscriber, publisher Options, n int) (lost []int, twice int) {
	t.Helper()
	var mu sync.Mutex
	got := map[string]int{}
	collect := func(c *Client) {
		go func() {
			for p := range c.Messages() {
				mu.Lock()
				got[string(p.Payload)]++
				mu.Unlock()
			}
		}()
	}
	sub := MustDial(t, addr, subscriber)
	if code := sub.Subscribe(topic); code != 1 {
		t.Fatalf("brokertest: subscribe %q: SUBACK %#x", topic, code)
	}
	collect(sub)
	pub := MustDial(t, addr, publisher)
	for i := range n {
		var wg sync.WaitGroup
		var next *Client
		var dialErr error
		wg.Go(func() {
			if _, err := pub.PublishWith(&paho.Publish{Topic: topic, QoS: 1, Payload: []byte(fmt.Sprint(i))}); err != nil {
				t.Error(err)
			}
		})
		// Dial, not MustDial: t.Fatal from another goroutine would leave next nil.
		wg.Go(func() { next, dialErr = Dial(t, addr, subscriber) })
		wg.Wait()
		if dialErr != nil {
			t.Fatalf("brokertest: take-over connection %d: %v", i, dialErr)
		}
		collect(next)
	}
	count := func() (lost []int, twice int) {
		mu.Lock()
		defer mu.Unlock()
		for i := range n {
			switch got[fmt.Sprint(i)] {
			case 0:
				lost = append(lost, i)
			case 1:
			default:
				twice++
			}
		}
		return lost, twice
	}
	deadline := time.Now().Add(10 * time.Second)
	lost, twice = count()
	for len(lost) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		lost, twice = count()
	}
	return lost, twice
}
