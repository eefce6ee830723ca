package gateway

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/a2a-fleet/a2a-fleet/test/testenv"
)

// TestHTTPFieldsAreValidated: the API server refuses a spec.http that the gateway could not use,
// with a message naming the field.
func TestHTTPFieldsAreValidated(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := cp.NewNamespace(t, ctx, "gw-adm-")
	agent := func(http string) string {
		return "apiVersion: a2a.fleet.dev/v1alpha1\nkind: Agent\nmetadata: {name: bad}\nspec:\n  orgID: o\n  unitID: u\n  card: {name: a}\n  http: " + http + "\n"
	}
	for _, tc := range []struct{ name, http, want string }{
		{"url not http", "{url: 'ftp://example.com/a2a'}", "http.url must be an absolute http:// or https:// URL"},
		{"url not a URL", "{url: 'deploy:8080'}", "http.url must be an absolute http:// or https:// URL"},
		{"service account name", "{serviceAccounts: ['Not_A_Name']}", "spec.http.serviceAccounts[0]"},
		{"duplicate service account", "{serviceAccounts: [a, a]}", "Duplicate value"},
	} {
		err := testenv.Create(ctx, k8s, ns, agent(tc.http))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
	}
	if err := testenv.Create(ctx, k8s, ns, agent("{expose: true, serviceAccounts: [caller], url: 'https://deploy.sales.svc:8443/'}")); err != nil {
		t.Fatalf("a valid spec.http: %v", err)
	}
}
