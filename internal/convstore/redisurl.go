package convstore

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// A Redis store is named by a URL (the conversation service's --store):
//
//	redis://[user:password@]host:port/db          one server (rediss:// with TLS)
//	redis+sentinel://[user:password@]sentinel:port/db?addr=sentinel2:port&addr=...&master_name=NAME
//	                                              the primary of a Sentinel-managed set
//	                                              (rediss+sentinel:// with TLS)
//	redis+cluster://[user:password@]node:port?addr=node2:port&...
//	                                              a Redis Cluster (rediss+cluster:// with TLS)
//
// Each is parsed by go-redis' own parser for that client (ParseURL, ParseFailoverURL,
// ParseClusterURL: every option of theirs, such as dial_timeout or max_retries, is accepted) and
// served by go-redis' own client (Client, FailoverClient, ClusterClient). With Sentinel the
// user and password of the URL authenticate to the sentinels and, unless the username= and
// password= parameters say otherwise, to the data nodes too (one secret for the set, as
// most deployments have it). With TLS every node's certificate is verified against its own
// address (the name the sentinels report), not the first sentinel's.
//
// Two parameters are the journal's own (docs/conversation-service.md, "Replicated Redis"):
//
//	wait_replicas=N    a group commit is durable once N replicas acknowledged it (WAIT); with
//	                   fewer within wait_timeout it fails, and the request it carried is refused
//	                   with -32004 (retryable). Default: 1 with Sentinel, 0 otherwise.
//	wait_timeout=D     how long a commit waits for those acknowledgements (default 1s).
//
// With Sentinel, dial_timeout defaults to SentinelDialTimeout instead of go-redis' 5 s: after a
// network cut of the primary a retry dials the old primary's address until the sentinels name
// another, and each such dial waits out the timeout (docs/reliability.md, "Redis failover").

// RedisStore is what a Redis store URL says: how to reach the data and what makes a commit
// durable.
type RedisStore struct {
	// Kind is "redis", "sentinel" or "cluster".
	Kind string
	// WaitReplicas and WaitTimeout: see the URL's wait_replicas and wait_timeout.
	WaitReplicas int
	WaitTimeout  time.Duration

	single   *redis.Options
	failover *redis.FailoverOptions
	cluster  *redis.ClusterOptions
}

// DefaultWaitTimeout bounds how long a commit waits for its replica acknowledgements.
const DefaultWaitTimeout = time.Second

// SentinelDialTimeout is a Sentinel store's dial timeout unless its URL sets dial_timeout: a
// connect to a node of the set, its TLS handshake included, takes milliseconds inside a
// cluster, and a dropped SYN should not hold a commit for long. Raise it for slow links.
const SentinelDialTimeout = time.Second

// IsRedisURL reports whether store names a Redis store (any of the schemes above).
func IsRedisURL(store string) bool {
	scheme, _, ok := strings.Cut(store, "://")
	if !ok {
		return false
	}
	switch scheme {
	case "redis", "rediss", "redis+sentinel", "rediss+sentinel", "redis+cluster", "rediss+cluster":
		return true
	}
	return false
}

// ParseRedisURL parses a Redis store URL.
func ParseRedisURL(store string) (*RedisStore, error) {
	u, err := url.Parse(store)
	if err != nil {
		return nil, fmt.Errorf("redis store URL: %w", err)
	}
	base, kind, _ := strings.Cut(u.Scheme, "+")
	if base != "redis" && base != "rediss" {
		return nil, fmt.Errorf("redis store URL: scheme %q: want redis, rediss, redis+sentinel, rediss+sentinel, redis+cluster or rediss+cluster", u.Scheme)
	}
	s := &RedisStore{Kind: "redis", WaitTimeout: DefaultWaitTimeout}
	// The journal's own parameters; the rest are go-redis'.
	q := u.Query()
	waitSet := q.Has("wait_replicas")
	if v := q.Get("wait_replicas"); waitSet {
		if s.WaitReplicas, err = strconv.Atoi(v); err != nil || s.WaitReplicas < 0 {
			return nil, fmt.Errorf("redis store URL: wait_replicas=%q: want a number of replicas (0 or more)", v)
		}
	}
	if v := q.Get("wait_timeout"); q.Has("wait_timeout") {
		if s.WaitTimeout, err = time.ParseDuration(v); err != nil || s.WaitTimeout <= 0 {
			return nil, fmt.Errorf("redis store URL: wait_timeout=%q: want a positive duration such as 500ms", v)
		}
	}
	q.Del("wait_replicas")
	q.Del("wait_timeout")
	u.RawQuery = q.Encode()
	u.Scheme = base
	switch kind {
	case "":
		if s.single, err = redis.ParseURL(u.String()); err != nil {
			return nil, fmt.Errorf("redis store URL: %w", err)
		}
	case "sentinel":
		s.Kind = "sentinel"
		if !waitSet {
			s.WaitReplicas = 1
		}
		if s.failover, err = redis.ParseFailoverURL(u.String()); err != nil {
			return nil, fmt.Errorf("redis+sentinel store URL: %w", err)
		}
		if s.failover.MasterName == "" {
			return nil, errors.New("redis+sentinel store URL: master_name is required (the name the sentinels monitor the primary under)")
		}
		if !q.Has("username") && !q.Has("password") {
			s.failover.Username, s.failover.Password = s.failover.SentinelUsername, s.failover.SentinelPassword
		}
		if !q.Has("dial_timeout") {
			s.failover.DialTimeout = SentinelDialTimeout
		}
		if s.failover.TLSConfig != nil {
			// Verify each node against its own address, not the first sentinel's name.
			s.failover.TLSConfig.ServerName = ""
		}
	case "cluster":
		s.Kind = "cluster"
		if s.cluster, err = redis.ParseClusterURL(u.String()); err != nil {
			return nil, fmt.Errorf("redis+cluster store URL: %w", err)
		}
		if s.cluster.TLSConfig != nil {
			s.cluster.TLSConfig.ServerName = ""
		}
	default:
		return nil, fmt.Errorf("redis store URL: scheme %q: want redis, rediss, redis+sentinel, rediss+sentinel, redis+cluster or rediss+cluster", u.Scheme)
	}
	return s, nil
}

// WithRedisPassword puts password into a Redis store URL's user information (properly
// escaped), keeping its user name, unless the URL carries a password already: the service
// takes the password from a Secret (A2A_REDIS_PASSWORD), not from its command line.
func WithRedisPassword(store, password string) (string, error) {
	if password == "" || !IsRedisURL(store) {
		return store, nil
	}
	u, err := url.Parse(store)
	if err != nil {
		return "", fmt.Errorf("redis store URL: %w", err)
	}
	if _, set := u.User.Password(); set {
		return store, nil
	}
	u.User = url.UserPassword(u.User.Username(), password)
	return u.String(), nil
}

// NewClient returns go-redis' client for the store (the caller owns it).
func (s *RedisStore) NewClient() redis.UniversalClient {
	switch {
	case s.failover != nil:
		return redis.NewFailoverClient(s.failover)
	case s.cluster != nil:
		return redis.NewClusterClient(s.cluster)
	}
	return redis.NewClient(s.single)
}

// Describe names the store for logs and errors, without credentials.
func (s *RedisStore) Describe() string {
	switch {
	case s.failover != nil:
		return fmt.Sprintf("sentinel set %q via %s", s.failover.MasterName, strings.Join(s.failover.SentinelAddrs, ","))
	case s.cluster != nil:
		return "cluster via " + strings.Join(s.cluster.Addrs, ",")
	}
	return s.single.Addr
}

// Open connects to the store and returns its journal: the client answered a PING, and the
// primary has the replicas WaitReplicas asks for (else the error says how many it has).
func (s *RedisStore) Open(ctx context.Context, prefix string) (*RedisJournal, error) {
	c := s.NewClient()
	j := NewRedisJournalWith(c, RedisJournalOptions{Prefix: prefix, WaitReplicas: s.WaitReplicas, WaitTimeout: s.WaitTimeout})
	if err := j.Ping(ctx); err != nil {
		_ = j.Close()
		return nil, fmt.Errorf("redis store %s: %w", s.Describe(), err)
	}
	return j, nil
}
