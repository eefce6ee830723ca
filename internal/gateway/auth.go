package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

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
