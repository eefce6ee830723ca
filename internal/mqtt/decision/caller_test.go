package decision_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/decision"
)

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// TestCallerCache: the caller speaks go-auth's protocol to the handler and keeps answers (allows
// and denials) for the TTL, so a revocation reaches a cached answer only when it expires;
// errors (the table not ready) are never kept.
func TestCallerCache(t *testing.T) {
	s := table(t)
	var ready atomic.Bool
	h, err := decision.NewHandler(decision.Config{Decider: s, Ready: ready.Load})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	clk := &clock{now: time.Unix(1000, 0)}
	c, err := decision.NewCaller(decision.CallerConfig{BaseURL: srv.URL, AuthCacheTTL: 10 * time.Second, ACLCacheTTL: 10 * time.Second, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := c.Authenticate(userCaller, pwCaller, "c"); ok || err == nil {
		t.Fatalf("before the sync: ok=%v err=%v, want a refusal with an error (503)", ok, err)
	}
	ready.Store(true)
	if ok, err := c.Authenticate(userCaller, pwCaller, "c"); !ok || err != nil {
		t.Fatalf("after the sync: ok=%v err=%v, want allowed (the 503 was not cached)", ok, err)
	}
	if ok, _ := c.Authenticate(userCaller, "wrong", "c"); ok {
		t.Fatal("wrong password allowed")
	}
	topic := "$a2a/v1/request/acme/u/agent"
	if ok, err := c.Allows(userCaller, "c", topic, decision.GoAuthWrite); !ok || err != nil {
		t.Fatalf("publish: ok=%v err=%v", ok, err)
	}
	asked := c.Asked()
	// superuser + acl: two requests per uncached check; a cached one costs none.
	if ok, _ := c.Allows(userCaller, "c", topic, decision.GoAuthWrite); !ok || c.Asked() != asked {
		t.Fatalf("cached publish: ok=%v asked %d→%d", ok, asked, c.Asked())
	}
	if err := s.Execute(context.Background(), []acl.Command{{Op: acl.OpRemoveClientRole, Username: userCaller, Role: "a2a:role/caller"}}); err != nil {
		t.Fatal(err)
	}
	clk.add(9 * time.Second)
	if ok, _ := c.Allows(userCaller, "c", topic, decision.GoAuthWrite); !ok {
		t.Fatal("revoked before the TTL: the answer was not cached")
	}
	clk.add(time.Second)
	if ok, _ := c.Allows(userCaller, "c", topic, decision.GoAuthWrite); ok {
		t.Fatal("still allowed after the TTL")
	}
	if c.Asked() != asked+2 {
		t.Errorf("asked %d, want %d (superuser + acl once more)", c.Asked(), asked+2)
	}
	// A denial is cached too (as go-auth does): an allow granted now shows after the TTL.
	if err := s.Execute(context.Background(), []acl.Command{{Op: acl.OpAddClientRole, Username: userCaller, Role: "a2a:role/caller"}}); err != nil {
		t.Fatal(err)
	}
	if ok, _ := c.Allows(userCaller, "c", topic, decision.GoAuthWrite); ok {
		t.Fatal("cached denial not kept")
	}
	clk.add(10 * time.Second)
	if ok, _ := c.Allows(userCaller, "c", topic, decision.GoAuthWrite); !ok {
		t.Fatal("grant not seen after the TTL")
	}
}

// TestCallerErrors: an endpoint that is down is an error (the broker refuses and asks again).
func TestCallerErrors(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusInternalServerError) }))
	c, err := decision.NewCaller(decision.CallerConfig{BaseURL: srv.URL, ACLCacheTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := c.Allows("u", "c", "t", decision.GoAuthWrite); ok || err == nil {
		t.Fatalf("500: ok=%v err=%v, want an error", ok, err)
	}
	srv.Close()
	if ok, err := c.Allows("u", "c", "t", decision.GoAuthWrite); ok || err == nil {
		t.Fatalf("closed: ok=%v err=%v, want an error", ok, err)
	}
	if _, err := decision.NewCaller(decision.CallerConfig{}); err == nil {
		t.Fatal("no base URL accepted")
	}
}
