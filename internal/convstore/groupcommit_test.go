package convstore

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// recordingCommit is a commit function that records each group and the
// stack it ran on, optionally taking its time.
type recordingCommit struct {
	mu     sync.Mutex
	groups [][]string
	stacks []string
	delay  time.Duration
}

func (r *recordingCommit) commit(batch []Change) error {
	if r.delay > 0 {
		time.Sleep(r.delay)
	}
	buf := make([]byte, 16<<10)
	buf = buf[:runtime.Stack(buf, false)]
	ids := make([]string, len(batch))
	for i, c := range batch {
		ids[i] = c.ContextID
	}
	r.mu.Lock()
	r.groups = append(r.groups, ids)
	r.stacks = append(r.stacks, string(buf))
	r.mu.Unlock()
	return nil
}

func (r *recordingCommit) committed() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var all []string
	for _, g := range r.groups {
		all = append(all, g...)
	}
	return all
}

// TestLoneWaiterCommitsItself: with no commit running, the waiter commits its
// group on its own goroutine (no hand-off to another thread on the durable
// path).
func TestLoneWaiterCommitsItself(t *testing.T) {
	rc := &recordingCommit{}
	g := newGroupCommitter(rc.commit)
	defer g.close()
	for i := range 3 {
		tk := g.Append(Change{ContextID: fmt.Sprint(i)})
		if err := tk.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(rc.groups) != 3 {
		t.Fatalf("groups %v, want one per waited change", rc.groups)
	}
	for i, s := range rc.stacks {
		if !strings.Contains(s, "(*Ticket).Wait") || !strings.Contains(s, "TestLoneWaiterCommitsItself") {
			t.Errorf("commit %d did not run on the waiter's goroutine:\n%s", i, s)
		}
	}
}

// TestUnwaitedChangesAreCommitted: changes nobody waits for are committed
// within flushDelay (by the timer), in order.
func TestUnwaitedChangesAreCommitted(t *testing.T) {
	rc := &recordingCommit{}
	g := newGroupCommitter(rc.commit)
	defer g.close()
	for i := range 5 {
		g.Append(Change{ContextID: fmt.Sprint(i)})
	}
	deadline := time.Now().Add(2 * time.Second)
	for len(rc.committed()) < 5 {
		if time.Now().After(deadline) {
			t.Fatalf("after 2 s only %v committed", rc.committed())
		}
		time.Sleep(time.Millisecond)
	}
	if got := strings.Join(rc.committed(), ","); got != "0,1,2,3,4" {
		t.Errorf("committed %s, want 0,1,2,3,4", got)
	}
}

// TestConcurrentWaitersShareCommits: many concurrent appenders and waiters:
// every change is committed exactly once, each context's changes in the order
// they were appended, and groups form while a commit runs.
func TestConcurrentWaitersShareCommits(t *testing.T) {
	rc := &recordingCommit{delay: 200 * time.Microsecond}
	g := newGroupCommitter(rc.commit)
	const writers, each = 16, 200
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				tk := g.Append(Change{ContextID: fmt.Sprintf("%02d/%04d", w, i)})
				if i%3 != 0 { // some changes are never waited for
					if err := tk.Wait(context.Background()); err != nil {
						t.Error(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	g.close()
	all := rc.committed()
	if len(all) != writers*each {
		t.Fatalf("%d changes committed, want %d", len(all), writers*each)
	}
	next := map[string]int{}
	for _, id := range all {
		var w, i int
		if _, err := fmt.Sscanf(id, "%02d/%04d", &w, &i); err != nil {
			t.Fatal(err)
		}
		key := fmt.Sprint(w)
		if i != next[key] {
			t.Fatalf("writer %d: change %d committed where %d was next", w, i, next[key])
		}
		next[key]++
	}
	rc.mu.Lock()
	groups := len(rc.groups)
	rc.mu.Unlock()
	if groups >= writers*each {
		t.Errorf("%d commits for %d changes: no group commit", groups, writers*each)
	}
	t.Logf("%d changes in %d commits", len(all), groups)
}

// TestWaitGivesUpOnItsContext: a waiter whose context ends while another
// leader's slow commit runs returns the context's error; the change is still
// committed.
func TestWaitGivesUpOnItsContext(t *testing.T) {
	rc := &recordingCommit{delay: 300 * time.Millisecond}
	g := newGroupCommitter(rc.commit)
	first := g.Append(Change{ContextID: "a"})
	go func() { _ = first.Wait(context.Background()) }()
	time.Sleep(50 * time.Millisecond) // the first commit runs
	second := g.Append(Change{ContextID: "b"})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := second.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait = %v, want the context's deadline", err)
	}
	g.close()
	if got := strings.Join(rc.committed(), ","); got != "a,b" {
		t.Errorf("committed %s, want a,b", got)
	}
}

// TestCloseCommitsPendingAndRefusesMore: close commits what is pending, even
// with nobody waiting, and later appends fail with ErrClosed.
func TestCloseCommitsPendingAndRefusesMore(t *testing.T) {
	rc := &recordingCommit{}
	g := newGroupCommitter(rc.commit)
	g.Append(Change{ContextID: "x"}, Change{ContextID: "y"})
	g.close()
	if got := strings.Join(rc.committed(), ","); got != "x,y" {
		t.Errorf("committed %s, want x,y", got)
	}
	if err := g.Append(Change{ContextID: "z"}).Wait(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("append after close: %v, want ErrClosed", err)
	}
}

// TestThenLoneCallerCommitsItself: with no commit running, Then commits the
// group on the caller's goroutine and has run fn, after the commit, when it
// returns.
func TestThenLoneCallerCommitsItself(t *testing.T) {
	rc := &recordingCommit{}
	g := newGroupCommitter(rc.commit)
	defer g.close()
	for i := range 3 {
		ran := false
		g.Append(Change{ContextID: fmt.Sprint(i)}).Then(func(err error) {
			if err != nil {
				t.Error(err)
			}
			if c := rc.committed(); len(c) != i+1 {
				t.Errorf("continuation %d ran before its commit (committed %v)", i, c)
			}
			ran = true
		})
		if !ran {
			t.Fatalf("continuation %d had not run when Then returned", i)
		}
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for i, s := range rc.stacks {
		if !strings.Contains(s, "(*Ticket).Then") || !strings.Contains(s, "TestThenLoneCallerCommitsItself") {
			t.Errorf("commit %d did not run on the caller's goroutine:\n%s", i, s)
		}
	}
}

// TestThenConcurrent: continuations registered while commits run are each
// run exactly once, after their own change is committed, and with the
// commit's error; groups share commits.
func TestThenConcurrent(t *testing.T) {
	for _, fail := range []bool{false, true} {
		t.Run(fmt.Sprintf("fail=%v", fail), func(t *testing.T) {
			rc := &recordingCommit{delay: 200 * time.Microsecond}
			commitErr := errors.New("disk gone")
			commit := rc.commit
			if fail {
				commit = func(b []Change) error { _ = rc.commit(b); return commitErr }
			}
			g := newGroupCommitter(commit)
			const writers, each = 16, 100
			var mu sync.Mutex
			ran := map[string]int{}
			var wg sync.WaitGroup
			for w := range writers {
				wg.Go(func() {
					for i := range each {
						id := fmt.Sprintf("%d-%d", w, i)
						g.Append(Change{ContextID: id}).Then(func(err error) {
							if fail != (err != nil) || (fail && !errors.Is(err, commitErr)) {
								t.Errorf("%s: err %v", id, err)
							}
							if !slices.Contains(rc.committed(), id) {
								t.Errorf("%s: continuation before its commit", id)
							}
							mu.Lock()
							ran[id]++
							mu.Unlock()
						})
					}
				})
			}
			wg.Wait()
			g.close()
			mu.Lock()
			defer mu.Unlock()
			if len(ran) != writers*each {
				t.Fatalf("%d continuations ran, want %d", len(ran), writers*each)
			}
			for id, n := range ran {
				if n != 1 {
					t.Fatalf("%s ran %d times", id, n)
				}
			}
			rc.mu.Lock()
			groups := len(rc.groups)
			rc.mu.Unlock()
			if groups >= writers*each {
				t.Fatalf("%d commits for %d changes: no group commit", groups, writers*each)
			}
			t.Logf("%d changes in %d commits", writers*each, groups)
		})
	}
}
