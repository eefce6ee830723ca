package decision

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// CallerConfig configures NewCaller. Its options are mosquitto-go-auth's HTTP backend options
// (http_host, http_port, http_getuser_uri, http_superuser_uri, http_aclcheck_uri,
// http_timeout, auth_cache_seconds, acl_cache_seconds), so one broker configuration fits both.
type CallerConfig struct {
	// BaseURL is the decision endpoint, e.g. http://decision:8080.
	BaseURL string
	// UserURI, SuperuserURI and ACLURI default to the handler's go-auth routes; SuperuserURI
	// "-" leaves the superuser question out (go-auth without http_superuser_uri).
	UserURI, SuperuserURI, ACLURI string
	// Timeout of one request (default 5 s, go-auth's http_timeout).
	Timeout time.Duration
	// AuthCacheTTL and ACLCacheTTL keep answers (allows and denials, as go-auth's cache does;
	// errors are never kept) for that long. 0: ask every time.
	AuthCacheTTL, ACLCacheTTL time.Duration
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
}

// Caller is the broker side of go-auth's HTTP backend protocol with go-auth's answer cache:
// what mosquitto-go-auth does at CONNECT and at every ACL check, used by the project's
// HTTP-auth Mosquitto plugin (hack/mosquitto-plugin/httpauth). It is safe for concurrent use.
type Caller struct {
	cfg    CallerConfig
	client *http.Client

	mu        sync.Mutex
	auth      map[authKey]cached
	acls      map[aclKey]cached
	sweepSize int
	asked     uint64
}

type authKey struct {
	username, clientID string
	password           [sha256.Size]byte // never the plaintext
}

type aclKey struct {
	username, clientID, topic string
	acc                       int
}

type cached struct {
	ok      bool
	expires time.Time
}

// NewCaller returns a Caller for cfg.
func NewCaller(cfg CallerConfig) (*Caller, error) {
	if cfg.BaseURL == "" {
		return nil, fmt.Errorf("decision: caller needs a base URL")
	}
	cfg.BaseURL = strings.TrimSuffix(cfg.BaseURL, "/")
	if cfg.UserURI == "" {
		cfg.UserURI = GoAuthPrefix + "user"
	}
	if cfg.SuperuserURI == "" {
		cfg.SuperuserURI = GoAuthPrefix + "superuser"
	}
	if cfg.ACLURI == "" {
		cfg.ACLURI = GoAuthPrefix + "acl"
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Caller{cfg: cfg, client: &http.Client{Timeout: cfg.Timeout},
		auth: map[authKey]cached{}, acls: map[aclKey]cached{}, sweepSize: 1024}, nil
}

// Asked is the number of HTTP requests made so far (cache misses).
func (c *Caller) Asked() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.asked
}

// Authenticate asks the user endpoint (or the cache).
func (c *Caller) Authenticate(username, password, clientID string) (bool, error) {
	k := authKey{username: username, clientID: clientID, password: sha256.Sum256([]byte(password))}
	if ok, hit := lookup(c, c.auth, k); hit {
		return ok, nil
	}
	ok, err := c.ask(c.cfg.UserURI, map[string]any{"username": username, "password": password, "clientid": clientID})
	if err != nil {
		return false, err
	}
	store(c, c.auth, k, ok, c.cfg.AuthCacheTTL)
	return ok, nil
}

// Allows asks the superuser endpoint, then the ACL endpoint (go-auth's order), or the cache.
// acc is go-auth's (GoAuthRead, GoAuthWrite, GoAuthSubscribe, GoAuthUnsubscribe).
func (c *Caller) Allows(username, clientID, topic string, acc int) (bool, error) {
	k := aclKey{username: username, clientID: clientID, topic: topic, acc: acc}
	if ok, hit := lookup(c, c.acls, k); hit {
		return ok, nil
	}
	ok := false
	var err error
	if c.cfg.SuperuserURI != "-" {
		if ok, err = c.ask(c.cfg.SuperuserURI, map[string]any{"username": username}); err != nil {
			return false, err
		}
	}
	if !ok {
		if ok, err = c.ask(c.cfg.ACLURI, map[string]any{"username": username, "clientid": clientID, "topic": topic, "acc": acc}); err != nil {
			return false, err
		}
	}
	store(c, c.acls, k, ok, c.cfg.ACLCacheTTL)
	return ok, nil
}

func lookup[K comparable](c *Caller, m map[K]cached, k K) (ok, hit bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, found := m[k]
	if !found || !c.cfg.Now().Before(e.expires) {
		return false, false
	}
	return e.ok, true
}

func store[K comparable](c *Caller, m map[K]cached, k K, ok bool, ttl time.Duration) {
	if ttl <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.cfg.Now()
	m[k] = cached{ok: ok, expires: now.Add(ttl)}
	if len(m) > c.sweepSize {
		// Expired answers go when the map doubles: the cache stays bounded by what one TTL
		// sees, without a timer goroutine inside the broker.
		for key, e := range m {
			if !now.Before(e.expires) {
				delete(m, key)
			}
		}
		c.sweepSize = max(1024, 2*len(m))
	}
}

// ask posts a go-auth JSON request: 2xx is yes, 4xx no, anything else (5xx, a transport
// error) an error the broker turns into a refusal that is not cached.
func (c *Caller) ask(uri string, body map[string]any) (bool, error) {
	c.mu.Lock()
	c.asked++
	c.mu.Unlock()
	data, err := json.Marshal(body)
	if err != nil {
		return false, fmt.Errorf("decision: encode request: %w", err)
	}
	req, err := http.NewRequest(http.MethodPost, c.cfg.BaseURL+uri, bytes.NewReader(data))
	if err != nil {
		return false, fmt.Errorf("decision: request %s: %w", uri, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.client.Do(req)
	if err != nil {
		return false, fmt.Errorf("decision: %s: %w", uri, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return true, nil
	case resp.StatusCode >= 400 && resp.StatusCode < 500:
		return false, nil
	}
	return false, fmt.Errorf("decision: %s answered %s", uri, resp.Status)
}
