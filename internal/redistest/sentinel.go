package redistest

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelOptions configures StartSentinelSet. The zero value is a primary, two replicas and
// three sentinels (quorum 2) on 127.0.0.1 that fail the primary over 1 s after it stops
// answering.
type SentinelOptions struct {
	// Replicas (default 2) and Sentinels (default 3; the quorum is a majority of them).
	Replicas, Sentinels int
	// MasterName is the monitored set's name (default "a2af").
	MasterName string
	// DownAfter is Sentinel's down-after-milliseconds (default 1 s): how long the primary may
	// not answer before it is subjectively down.
	DownAfter time.Duration
	// FailoverTimeout is Sentinel's failover-timeout (default 10 s).
	FailoverTimeout time.Duration
	// PrimaryInNetns runs the primary in a network namespace of its own (NewNetns), so that the
	// test can cut it off the network (Netns.Cut); every other node then binds the host side of
	// the namespace's link, the address the primary reaches them at.
	PrimaryInNetns bool
	// ServerArgs are extra arguments of every redis-server (primary and replicas), e.g.
	// "--min-replicas-to-write", "1".
	ServerArgs []string
}

// SentinelSet is a primary, its replicas and the sentinels that watch them.
type SentinelSet struct {
	t          testing.TB
	MasterName string
	// Primary is the first primary; after a failover it may be a replica.
	Primary   *Server
	Replicas  []*Server
	Sentinels []*Server
	// Netns holds the primary with PrimaryInNetns.
	Netns *Netns
}

// StartSentinelSet starts the set and returns once every sentinel knows the primary, every
// replica and the other sentinels (a failover can happen from then on).
func StartSentinelSet(t testing.TB, o SentinelOptions) *SentinelSet {
	t.Helper()
	if o.Replicas == 0 {
		o.Replicas = 2
	}
	if o.Sentinels == 0 {
		o.Sentinels = 3
	}
	if o.MasterName == "" {
		o.MasterName = "a2af"
	}
	if o.DownAfter == 0 {
		o.DownAfter = time.Second
	}
	if o.FailoverTimeout == 0 {
		o.FailoverTimeout = 10 * time.Second
	}
	set := &SentinelSet{t: t, MasterName: o.MasterName}
	host := "127.0.0.1"
	if o.PrimaryInNetns {
		set.Netns = NewNetns(t)
		host = set.Netns.HostIP
		set.Primary = Start(t, Options{Netns: set.Netns, Args: o.ServerArgs})
	} else {
		set.Primary = Start(t, Options{Args: o.ServerArgs})
	}
	for range o.Replicas {
		args := append([]string{"--replicaof", set.Primary.Host, strconv.Itoa(set.Primary.Port)}, o.ServerArgs...)
		set.Replicas = append(set.Replicas, Start(t, Options{Host: host, Args: args}))
	}
	quorum := o.Sentinels/2 + 1
	for range o.Sentinels {
		dir := t.TempDir()
		conf := filepath.Join(dir, "sentinel.conf")
		set.Sentinels = append(set.Sentinels, startNode(t, SentinelBin(t), host, nil, func(port int) []string {
			cfg := fmt.Sprintf(`port %d
bind %s
dir %s
protected-mode no
sentinel monitor %s %s %d %d
sentinel down-after-milliseconds %s %d
sentinel failover-timeout %s %d
sentinel parallel-syncs %s 1
`, port, host, dir, o.MasterName, set.Primary.Host, set.Primary.Port, quorum,
				o.MasterName, o.DownAfter.Milliseconds(), o.MasterName, o.FailoverTimeout.Milliseconds(), o.MasterName)
			if err := os.WriteFile(conf, []byte(cfg), 0o600); err != nil {
				t.Fatal(err)
			}
			return []string{conf}
		}))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, s := range set.Sentinels {
		c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr()})
		for {
			replicas, _ := c.Replicas(ctx, o.MasterName).Result()
			sentinels, _ := c.Sentinels(ctx, o.MasterName).Result()
			if len(replicas) >= o.Replicas && len(sentinels) >= o.Sentinels-1 {
				break
			}
			select {
			case <-ctx.Done():
				_ = c.Close()
				t.Fatalf("sentinel %s knows %d replicas and %d other sentinels after 60 s, want %d and %d", s.Addr(), len(replicas), len(sentinels), o.Replicas, o.Sentinels-1)
			case <-time.After(100 * time.Millisecond):
			}
		}
		_ = c.Close()
	}
	return set
}

// SentinelAddrs are the sentinels' host:port.
func (s *SentinelSet) SentinelAddrs() []string {
	var out []string
	for _, n := range s.Sentinels {
		out = append(out, n.Addr())
	}
	return out
}

// Servers are the primary and the replicas, as started.
func (s *SentinelSet) Servers() []*Server { return append([]*Server{s.Primary}, s.Replicas...) }

// StoreURL is the set as a conversation-service store (docs/conversation-service.md, "Store"):
// redis+sentinel://first-sentinel/0?addr=...&master_name=... followed by query (url-encoded
// extra parameters, may be empty).
func (s *SentinelSet) StoreURL(query string) string {
	q := url.Values{}
	for _, a := range s.SentinelAddrs()[1:] {
		q.Add("addr", a)
	}
	q.Set("master_name", s.MasterName)
	u := "redis+sentinel://" + s.Sentinels[0].Addr() + "/0?" + q.Encode()
	if query != "" {
		u += "&" + query
	}
	return u
}

// PrimaryAddr is the primary's address as a majority of the sentinels report it now.
func (s *SentinelSet) PrimaryAddr(ctx context.Context) (string, error) {
	votes := map[string]int{}
	for _, n := range s.Sentinels {
		if !n.Running() {
			continue
		}
		c := redis.NewSentinelClient(&redis.Options{Addr: n.Addr(), DialTimeout: time.Second, ReadTimeout: time.Second, MaxRetries: -1})
		hp, err := c.GetMasterAddrByName(ctx, s.MasterName).Result()
		_ = c.Close()
		if err == nil && len(hp) == 2 {
			votes[net.JoinHostPort(hp[0], hp[1])]++
		}
	}
	for addr, n := range votes {
		if n > len(s.Sentinels)/2 {
			return addr, nil
		}
	}
	return "", fmt.Errorf("no majority of sentinels agree on the primary: %v", votes)
}

// Node is the server at addr among the primary and the replicas (nil if none).
func (s *SentinelSet) Node(addr string) *Server {
	for _, n := range s.Servers() {
		if n.Addr() == addr {
			return n
		}
	}
	return nil
}
