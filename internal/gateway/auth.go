package gateway

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	authnclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
)

// ErrUnauthenticated: no bearer token, or one the API server does not accept as a ServiceAccount's.
var ErrUnauthenticated = errors.New("unauthenticated")

// Caller is an authenticated HTTP caller: a ServiceAccount.
type Caller struct {
	Namespace, ServiceAccount string
}

// TokenReviewer authenticates bearer tokens with the API server's TokenReview (the same check
// the API server makes for its own clients), and accepts ServiceAccount tokens only.
type TokenReviewer struct {
	Reviews authnclient.TokenReviewInterface
	// Audiences, when set, are the audiences a token must be issued for (a token requested with
	// `kubectl create token SA --audience=...`); empty accepts the API server's default audience.
	Audiences []string
	// CacheTTL is how long an accepted token is taken without asking again (default
	// DefaultTokenCacheTTL; negative: ask every time), as the API server's own token cache does:
	// a review per request would make the API server every call's bottleneck. A refused token is
	// never cached.
	CacheTTL time.Duration

	mu    sync.Mutex
	cache map[[sha256.Size]byte]cachedCaller
}

// DefaultTokenCacheTTL is TokenReviewer's default CacheTTL (the API server's webhook token
// authenticator caches an accepted token for 2 minutes; a deleted ServiceAccount loses the
// gateway within this bound).
const DefaultTokenCacheTTL = 10 * time.Second

// maxCachedTokens bounds the cache; past it, it is emptied.
const maxCachedTokens = 10000

type cachedCaller struct {
	caller  Caller
	expires time.Time
}

func (t *TokenReviewer) cached(key [sha256.Size]byte, now time.Time) (Caller, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c, ok := t.cache[key]
	if !ok || now.After(c.expires) {
		return Caller{}, false
	}
	return c.caller, true
}

func (t *TokenReviewer) remember(key [sha256.Size]byte, c Caller, now time.Time) {
	ttl := t.CacheTTL
	if ttl == 0 {
		ttl = DefaultTokenCacheTTL
	}
	if ttl < 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cache == nil || len(t.cache) >= maxCachedTokens {
		t.cache = map[[sha256.Size]byte]cachedCaller{}
	}
	t.cache[key] = cachedCaller{caller: c, expires: now.Add(ttl)}
}

// bearerToken returns the token of an "Authorization: Bearer ..." header.
func bearerToken(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
		return "", false
	}
	return strings.TrimSpace(token), true
}

// Authenticate checks the request's bearer token.
func (t *TokenReviewer) Authenticate(ctx context.Context, r *http.Request) (Caller, error) {
	token, ok := bearerToken(r)
	if !ok {
		return Caller{}, fmt.Errorf("%w: no bearer token", ErrUnauthenticated)
	}
	key, now := sha256.Sum256([]byte(token)), time.Now()
	if c, ok := t.cached(key, now); ok {
		return c, nil
	}
	review, err := t.Reviews.Create(ctx, &authnv1.TokenReview{
		Spec: authnv1.TokenReviewSpec{Token: token, Audiences: t.Audiences},
	}, metav1.CreateOptions{})
	if err != nil {
		return Caller{}, fmt.Errorf("token review: %w", err)
	}
	if !review.Status.Authenticated {
		return Caller{}, fmt.Errorf("%w: token not accepted: %s", ErrUnauthenticated, review.Status.Error)
	}
	c, ok := serviceAccountOf(review.Status.User.Username)
	if !ok {
		return Caller{}, fmt.Errorf("%w: %s is not a ServiceAccount", ErrUnauthenticated, review.Status.User.Username)
	}
	t.remember(key, c, now)
	return c, nil
}

// serviceAccountOf parses the user name the API server gives a ServiceAccount token:
// system:serviceaccount:{namespace}:{name}.
func serviceAccountOf(username string) (Caller, bool) {
	rest, ok := strings.CutPrefix(username, "system:serviceaccount:")
	if !ok {
		return Caller{}, false
	}
	ns, name, ok := strings.Cut(rest, ":")
	if !ok || ns == "" || name == "" || strings.Contains(name, ":") {
		return Caller{}, false
	}
	return Caller{Namespace: ns, ServiceAccount: name}, true
}
