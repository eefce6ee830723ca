package identity

import (
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	cases := []struct {
		name    string
		id      Identity
		wantErr string
	}{
		{"valid", Identity{"acme", "sales", "agent-1.v2_x"}, ""},
		{"empty org", Identity{"", "u", "a"}, "orgID must not be empty"},
		{"slash in unit", Identity{"o", "u/x", "a"}, "unitID \"u/x\" must match"},
		{"wildcard in agent", Identity{"o", "u", "+"}, "agentID \"+\" must match"},
		{"hash in agent", Identity{"o", "u", "#"}, "agentID \"#\" must match"},
		{"space", Identity{"o p", "u", "a"}, "orgID \"o p\" must match"},
		{"too long", Identity{"o", "u", strings.Repeat("a", 65)}, "longer than 64"},
		{"max length", Identity{"o", "u", strings.Repeat("a", 64)}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.id.Validate()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error = %v, want it to contain %q", err, tc.wantErr)
			}
		})
	}
}

func TestTopics(t *testing.T) {
	id := Identity{"acme", "sales", "planner"}
	if got, want := id.ClientID(), "acme/sales/planner"; got != want {
		t.Fatalf("ClientID = %q, want %q", got, want)
	}
	got := id.Topics("")
	want := Topics{
		Request:     "$a2a/v1/request/acme/sales/planner",
		ReplyPrefix: "$a2a/v1/reply/acme/sales/planner",
		Discovery:   "$a2a/v1/discovery/acme/sales/planner",
		Event:       "$a2a/v1/event/acme/sales/planner",
	}
	if got != want {
		t.Fatalf("Topics = %+v, want %+v", got, want)
	}
	if pool := id.Topics("p1").Pool; pool != "$a2a/v1/request/acme/sales/pool/p1" {
		t.Fatalf("pool topic = %q", pool)
	}
}
