package convstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
	"github.com/a2a-fleet/a2a-fleet/internal/redistest"
)

func TestParseRedisURL(t *testing.T) {
	for _, tc := range []struct {
		url, kind, desc string
		wait            int
		timeout         time.Duration
		check           func(t *testing.T, s *RedisStore)
		err             string
	}{
		{url: "redis://h:1/2", kind: "redis", desc: "h:1", check: func(t *testing.T, s *RedisStore) {
			if s.single.DB != 2 || s.single.TLSConfig != nil {
				t.Errorf("options %+v", s.single)
			}
		}},
		{url: "rediss://u:p@h:1/0?wait_replicas=2&wait_timeout=250ms&dial_timeout=3s", kind: "redis", desc: "h:1", wait: 2, timeout: 250 * time.Millisecond,
			check: func(t *testing.T, s *RedisStore) {
				if s.single.Username != "u" || s.single.Password != "p" || s.single.TLSConfig == nil || s.single.DialTimeout != 3*time.Second {
					t.Errorf("options %+v", s.single)
				}
			}},
		{url: "redis+sentinel://:secret@s1:26379/1?addr=s2:26379&addr=s3:26379&master_name=a2af", kind: "sentinel", wait: 1,
			desc: `sentinel set "a2af" via s1:26379,s2:26379,s3:26379`, check: func(t *testing.T, s *RedisStore) {
				f := s.failover
				// One secret for the set: the sentinels' and the data nodes'.
				if f.SentinelPassword != "secret" || f.Password != "secret" || f.DB != 1 || f.TLSConfig != nil {
					t.Errorf("options %+v", f)
				}
				if f.DialTimeout != SentinelDialTimeout {
					t.Errorf("dial timeout %s, want the Sentinel default %s", f.DialTimeout, SentinelDialTimeout)
				}
			}},
		{url: "redis+sentinel://s1:26379/0?master_name=m&dial_timeout=4s", kind: "sentinel", wait: 1,
			desc: `sentinel set "m" via s1:26379`, check: func(t *testing.T, s *RedisStore) {
				if s.failover.DialTimeout != 4*time.Second {
					t.Errorf("dial timeout %s, want the URL's 4s", s.failover.DialTimeout)
				}
			}},
		{url: "rediss+sentinel://:s@s1:26379/0?master_name=m&password=data&wait_replicas=0", kind: "sentinel", wait: 0,
			desc: `sentinel set "m" via s1:26379`, check: func(t *testing.T, s *RedisStore) {
				f := s.failover
				if f.SentinelPassword != "s" || f.Password != "data" || f.TLSConfig == nil || f.TLSConfig.ServerName != "" {
					t.Errorf("options %+v (TLS %+v)", f, f.TLSConfig)
				}
			}},
		{url: "redis+cluster://n1:7000?addr=n2:7000&wait_replicas=1", kind: "cluster", wait: 1, desc: "cluster via n1:7000,n2:7000"},
		{url: "redis+sentinel://s1:26379/0", err: "master_name is required"},
		{url: "redis://h:1/0?wait_replicas=-1", err: "wait_replicas"},
		{url: "redis://h:1/0?wait_timeout=soon", err: "wait_timeout"},
		{url: "redis://h:1/0?no_such_option=1", err: "unexpected option"},
		{url: "memcached://h:1", err: "scheme"},
		{url: "redis+raft://h:1", err: "scheme"},
	} {
		t.Run(tc.url, func(t *testing.T) {
			if tc.err == "" && !IsRedisURL(tc.url) {
				t.Errorf("IsRedisURL(%q) = false", tc.url)
			}
			s, err := ParseRedisURL(tc.url)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one about %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.timeout == 0 {
				tc.timeout = DefaultWaitTimeout
			}
			if s.Kind != tc.kind || s.WaitReplicas != tc.wait || s.WaitTimeout != tc.timeout || s.Describe() != tc.desc {
				t.Errorf("kind %s wait %d/%s desc %q, want %s %d/%s %q", s.Kind, s.WaitReplicas, s.WaitTimeout, s.Describe(), tc.kind, tc.wait, tc.timeout, tc.desc)
			}
			if tc.check != nil {
				tc.check(t, s)
			}
		})
	}
	for _, tc := range []struct{ in, password, want string }{
		{"redis+sentinel://s1:26379/0?master_name=m", "p@ss/word:1", "redis+sentinel://:p%40ss%2Fword%3A1@s1:26379/0?master_name=m"},
		{"redis://user@h:1/0", "pw", "redis://user:pw@h:1/0"},
		{"redis://:inurl@h:1/0", "pw", "redis://:inurl@h:1/0"},
		{"bolt:/var/lib/state.db", "pw", "bolt:/var/lib/state.db"},
	} {
		got, err := WithRedisPassword(tc.in, tc.password)
		if err != nil || got != tc.want {
			t.Errorf("WithRedisPassword(%q) = %q %v, want %q", tc.in, got, err, tc.want)
		}
		if IsRedisURL(got) {
			if s, err := ParseRedisURL(got); err != nil {
				t.Errorf("%q does not parse: %v", got, err)
			} else if s.failover != nil && (s.failover.Password != tc.password || s.failover.SentinelPassword != tc.password) {
				t.Errorf("%q: passwords %q %q, want %q", got, s.failover.Password, s.failover.SentinelPassword, tc.password)
			}
		}
	}
	for _, notRedis := range []string{"bolt:/x", "redis", "redis:/x"} {
		if IsRedisURL(notRedis) {
			t.Errorf("IsRedisURL(%q) = true", notRedis)
		}
	}
}

// TestRedisCommitsWaitForReplicas: with wait_replicas a commit is durable
// only once a replica has it (read on the replica right after the commit
// returned); with the replica gone a commit fails with ErrNotReplicated after
// wait_timeout, and readiness says why; once the replica is back commits
// succeed again. Without wait_replicas (today's single server) a commit
// succeeds with the replica gone: what the option changes.
func TestRedisCommitsWaitForReplicas(t *testing.T) {
	ctx := context.Background()
	primary := redistest.Start(t, redistest.Options{})
	replica := redistest.Start(t, redistest.Options{Args: []string{"--replicaof", primary.Host, fmt.Sprint(primary.Port)}})
	waitLinked(t, primary, replica)
	j := openRedisURL(t, "redis://"+primary.Addr()+"/0?wait_replicas=1&wait_timeout=300ms", "wait")
	defer j.Close()
	unwaited := openRedisURL(t, "redis://"+primary.Addr()+"/0", "nowait")
	defer unwaited.Close()
	m, mu := NewMemory(j, true), NewMemory(unwaited, true)
	p := conversation.DefaultPolicy()
	onReplica := replica.Client()
	decide := func(m *Memory, task string) error {
		_, tk, err := m.Decide("o/u/a", p, t0, send(task, "C-"+task, "m", task))
		if err == nil {
			err = tk.Wait(ctx)
		}
		return err
	}
	if err := j.Ping(ctx); err != nil {
		t.Fatalf("ready with its replica: %v", err)
	}
	for i := range 20 {
		task := fmt.Sprintf("T%d", i)
		if err := decide(m, task); err != nil {
			t.Fatalf("commit with the replica up: %v", err)
		}
		// WAIT returned: the replica has applied it.
		if n, err := onReplica.Exists(ctx, "wait:{o/u/a}:c:C-"+task).Result(); err != nil || n != 1 {
			t.Fatalf("commit %s acknowledged but not on the replica: %d %v", task, n, err)
		}
	}

	replica.Kill()
	start := time.Now()
	err := decide(m, "lost-replica")
	took := time.Since(start)
	if !errors.Is(err, ErrNotReplicated) {
		t.Fatalf("commit without its replica: %v, want ErrNotReplicated", err)
	}
	if took < 250*time.Millisecond || took > 5*time.Second {
		t.Errorf("failed after %s, want about wait_timeout (300ms)", took)
	}
	t.Logf("without its replica a commit failed after %s: %v", took.Round(time.Millisecond), err)
	if err := j.Ping(ctx); err == nil || !strings.Contains(err.Error(), "0 replicas online") {
		t.Errorf("readiness without the replica: %v", err)
	}
	if err := decide(mu, "unwaited"); err != nil {
		t.Errorf("a journal that does not wait for replicas failed: %v", err)
	}

	replica.Restart()
	waitLinked(t, primary, replica)
	if err := decide(m, "replica-back"); err != nil {
		t.Fatalf("commit once the replica is back: %v", err)
	}
	if err := j.Ping(ctx); err != nil {
		t.Errorf("readiness with the replica back: %v", err)
	}
}

// waitLinked waits until the primary streams its writes to the replica: a write on one
// connection is acknowledged by WAIT. The replica's "link up" and the primary's "online" both come
// before that (Redis 7.0 after a diskless full sync: the primary starts streaming at the replica's
// first REPLCONF ACK, sent up to a second later), and a commit's WAIT with a shorter timeout would
// fail in between.
func waitLinked(t *testing.T, primary, replica *redistest.Server) {
	t.Helper()
	ctx := context.Background()
	conn := primary.Client().Conn()
	defer conn.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		role, _, up, err := replica.Role(ctx)
		acked := int64(0)
		if err == nil && role == "slave" && up {
			if err = conn.Set(ctx, "waitlinked-probe", time.Now().String(), 0).Err(); err == nil {
				acked, err = conn.Do(ctx, "wait", 1, 2000).Int64()
			}
		}
		if acked > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica %s not linked to its primary: %s, link up %v, write acknowledged by %d; %v", replica.Addr(), role, up, acked, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRedisSentinelFailoverKeepsAcknowledgedCommits: a journal on a
// Sentinel-managed primary (go-redis' FailoverClient, from a redis+sentinel
// URL, waiting for one replica by default) commits under load while the
// primary is killed (kill -9): every commit it acknowledged is in the state a
// fresh journal loads after the failover, commits succeed again on the
// promoted replica without a restart, and the old primary, restarted, rejoins
// as a replica.
func TestRedisSentinelFailoverKeepsAcknowledgedCommits(t *testing.T) {
	ctx := context.Background()
	set := redistest.StartSentinelSet(t, redistest.SentinelOptions{DownAfter: 2 * time.Second})
	url := set.StoreURL("")
	j := openRedisURL(t, url, "fo")
	defer j.Close()
	if j.waitReplicas != 1 {
		t.Fatalf("a sentinel store waits for %d replicas by default, want 1", j.waitReplicas)
	}
	m := NewMemory(j, true)
	p := conversation.DefaultPolicy()

	var (
		mu       sync.Mutex
		acked    []string
		failures []string
		firstErr time.Time
		lastErr  time.Time
	)
	stop := make(chan struct{})
	done := make(chan struct{})
	const writers = 4
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				task := fmt.Sprintf("W%d-%d", w, i)
				_, tk, err := m.Decide(fmt.Sprintf("o/u/a%d", w), p, t0, send(task, "C-"+task, "m", task))
				if err == nil {
					cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
					err = tk.Wait(cctx)
					cancel()
				}
				mu.Lock()
				if err == nil {
					acked = append(acked, fmt.Sprintf("o/u/a%d/C-%s", w, task))
				} else {
					if firstErr.IsZero() {
						firstErr = time.Now()
					}
					lastErr = time.Now()
					failures = append(failures, err.Error())
				}
				mu.Unlock()
				if err != nil {
					time.Sleep(50 * time.Millisecond)
				}
			}
		})
	}
	go func() { wg.Wait(); close(done) }()
	ackedNow := func() int { mu.Lock(); defer mu.Unlock(); return len(acked) }
	for ackedNow() < 200 {
		time.Sleep(10 * time.Millisecond)
	}
	old := set.Primary
	old.Kill()
	killed := time.Now()
	before := ackedNow()
	// Served again: 200 more acknowledged commits after the kill.
	deadline := time.Now().Add(60 * time.Second)
	for ackedNow() < before+200 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d commits acknowledged in the 60 s after the kill", ackedNow()-before)
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(stop)
	<-done
	promoted, err := set.PrimaryAddr(ctx)
	if err != nil || promoted == old.Addr() {
		t.Fatalf("primary after the kill: %q %v", promoted, err)
	}
	mu.Lock()
	t.Logf("%d commits acknowledged, %d failed (first failure %s after the kill, last %s after it); primary %s → %s",
		len(acked), len(failures), firstErr.Sub(killed).Round(time.Millisecond), lastErr.Sub(killed).Round(time.Millisecond), old.Addr(), promoted)
	kinds := map[string]int{}
	for _, f := range failures {
		kinds[f]++
	}
	for f, n := range kinds {
		t.Logf("  %d× %s", n, f)
	}
	want := append([]string(nil), acked...)
	mu.Unlock()

	// A fresh journal (a new client, as a restarted replica would open)
	// loads every acknowledged commit from the promoted primary.
	fresh := openRedisURL(t, url, "fo")
	defer fresh.Close()
	have := map[string]bool{}
	if err := fresh.Load(ctx, "", func(agent string, c *conversation.Context, _ []*Item) error {
		have[agent+"/"+c.ID] = true
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	lost := 0
	for _, k := range want {
		if !have[k] {
			lost++
			if lost <= 5 {
				t.Errorf("acknowledged commit %s lost in the failover", k)
			}
		}
	}
	if lost > 0 {
		t.Errorf("%d of %d acknowledged commits lost", lost, len(want))
	}

	// The old primary, restarted (empty: no persistence), is turned into a
	// replica of the promoted one by the sentinels.
	old.Restart()
	deadline = time.Now().Add(60 * time.Second)
	for {
		// The primary the sentinels name now (on a loaded machine they may fail over again).
		now, _ := set.PrimaryAddr(ctx)
		role, primary, up, err := old.Role(ctx)
		if err == nil && role == "slave" && primary == now && up {
			promoted = now
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("old primary not a linked replica of %s 60 s after its restart: %s of %s, link up %v, %v", now, role, primary, up, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("the old primary rejoined as a replica of %s", promoted)
	// It has the data too (a full sync from the promoted primary).
	n, err := old.Client().Exists(ctx, "fo:{o/u/a0}:s").Result()
	if err != nil || n != 1 {
		t.Errorf("the rejoined replica lacks the state: %d %v", n, err)
	}
}
