package mosqtable

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
)

// TestReadsShareAStatusSentAfterTheyBegan: a read (Observe, Check) answers from the mirror once
// the plugin has confirmed it current by an exchange sent after the read began (another read's
// status, or an execute), and asks the plugin itself otherwise. Counted in round trips: each
// status is one.
func TestReadsShareAStatusSentAfterTheyBegan(t *testing.T) {
	m := startBroker(t)
	be := connect(t, m)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	user, cmds := agent(1)
	execute(t, be, cmds)

	trips := func() uint64 { return be.Stats().RoundTrips }

	// Sequential reads each ask: nothing was sent after they began.
	before := trips()
	for range 3 {
		if _, err := be.Observe(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	if got := trips() - before; got != 3 {
		t.Fatalf("3 sequential Observes made %d round trips, want 3 (one status each)", got)
	}

	// A read that began before another read's status was sent shares it.
	asked := be.exchanges.Load()
	if _, err := be.Observe(ctx, nil); err != nil {
		t.Fatal(err)
	}
	before = trips()
	if err := be.currentSince(ctx, asked); err != nil {
		t.Fatal(err)
	}
	if got := trips() - before; got != 0 {
		t.Fatalf("a read that began before a confirming status made %d round trips, want 0", got)
	}
	// ... and one that began after it does not.
	before = trips()
	if err := be.currentSince(ctx, be.exchanges.Load()); err != nil {
		t.Fatal(err)
	}
	if got := trips() - before; got != 1 {
		t.Fatalf("a read that began after the last exchange made %d round trips, want 1", got)
	}

	// An execute whose answer continues the mirror's generation confirms it too.
	asked = be.exchanges.Load()
	execute(t, be, []acl.Command{{Op: acl.OpSetClientPassword, Username: user, Password: "pw2-" + user}})
	before = trips()
	if err := be.currentSince(ctx, asked); err != nil {
		t.Fatal(err)
	}
	if got := trips() - before; got != 0 {
		t.Fatalf("a read that began before a confirming execute made %d round trips, want 0", got)
	}

	// Another admin's change is seen by every read that begins after it: a second backend
	// changes the table, and the first one's next read exports it (its status shows a
	// generation it did not make).
	other := connect(t, m)
	_, cmds2 := agent(2)
	execute(t, other, cmds2)
	st, err := be.Observe(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := st.Clients["a2a:o/u/agent-00002"]; !ok {
		t.Fatal("a read after another admin's change did not see the client it created")
	}

	// Concurrent reads: every one succeeds, with at most one status each.
	const readers = 16
	before = trips()
	var wg sync.WaitGroup
	errs := make(chan error, readers)
	for range readers {
		wg.Go(func() {
			if _, err := be.Observe(ctx, nil); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := trips() - before; got > readers {
		t.Fatalf("%d concurrent Observes made %d round trips, want at most %d", readers, got, readers)
	}
	t.Logf("%d concurrent Observes: %d status round trips", readers, trips()-before)
}

// TestCachedReadsLearnOtherAdminsChangesFromTheirAnswers: ObserveCached (the reconciles' read)
// answers from the mirror with no round trip while the plugin has shown nothing the mirror lacks;
// another admin's change reaches it as that admin's answer on the shared response topic, and the
// next cached read reads the table again and sees it; a mirror not confirmed for CachedReadFor
// asks the plugin once. Counted in round trips.
func TestCachedReadsLearnOtherAdminsChangesFromTheirAnswers(t *testing.T) {
	m := startBroker(t)
	user, pass := m.TableAdmin()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const cacheFor = 300 * time.Millisecond
	be, err := Connect(ctx, Config{URL: m.URL(), Username: user, Password: pass, Timeout: 30 * time.Second, Logger: quiet, CachedReadFor: cacheFor})
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, m.Log())
	}
	t.Cleanup(func() { _ = be.Close(context.Background()) })
	trips := func() uint64 { return be.Stats().RoundTrips }
	observe := func() acl.State {
		t.Helper()
		st, err := be.ObserveCached(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}

	_, cmds := agent(1)
	execute(t, be, cmds)
	before := trips()
	for range 5 {
		observe()
	}
	if got := trips() - before; got != 0 {
		t.Fatalf("5 cached reads right after the backend's own change made %d round trips, want 0", got)
	}

	other := connect(t, m)
	_, cmds2 := agent(2)
	execute(t, other, cmds2)
	deadline := time.Now().Add(10 * time.Second)
	for {
		be.pmu.Lock()
		f := be.foreign
		be.pmu.Unlock()
		if f != nil && f.Generation > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the other admin's answer never reached the backend")
		}
		time.Sleep(5 * time.Millisecond)
	}
	before = trips()
	if _, ok := observe().Clients["a2a:o/u/agent-00002"]; !ok {
		t.Fatal("a cached read after the other admin's answer arrived does not show the client it created")
	}
	if got := trips() - before; got != 2 {
		t.Errorf("the cached read after another admin's change made %d round trips, want 2 (a status, the export)", got)
	}
	before = trips()
	observe()
	if got := trips() - before; got != 0 {
		t.Errorf("a cached read after the mirror caught up made %d round trips, want 0", got)
	}

	// Unconfirmed for longer than CachedReadFor: one status, then the mirror again.
	time.Sleep(cacheFor + 50*time.Millisecond)
	before = trips()
	observe()
	observe()
	if got := trips() - before; got != 1 {
		t.Errorf("two cached reads after the bound made %d round trips, want 1", got)
	}

	// Observe stays the read of "now": one status each.
	before = trips()
	if _, err := be.Observe(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if got := trips() - before; got != 1 {
		t.Errorf("Observe made %d round trips, want 1", got)
	}
}
