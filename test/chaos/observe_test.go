package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/test/cluster"
)

// brokerState reads the dynsec state Mosquitto keeps on its volume (dynamic-security.json, written
// at every change) as one line per client, group and role, without password hashes and salts
// (a re-created client has the same password under a new salt): what the operator put on the
// broker, comparable across a state loss. It reads the file in the broker's container.
func (f *fleet) brokerState(ctx context.Context) (map[string]string, error) {
	ready, err := env.Pods(ctx, cluster.Namespace, brokerPods)
	if err != nil || len(ready) != 1 {
		return nil, fmt.Errorf("%d ready broker pods (%v)", len(ready), err)
	}
	out, err := env.Exec(ctx, cluster.Namespace, ready[0].Name, "mosquitto", "cat", "/mosquitto/data/dynamic-security.json")
	if err != nil {
		return nil, err
	}
	data := []byte(out)
	type roleRef struct {
		Name     string `json:"rolename"`
		Priority int    `json:"priority"`
	}
	var state struct {
		Clients []struct {
			Username string    `json:"username"`
			ClientID string    `json:"clientid"`
			Roles    []roleRef `json:"roles"`
			Groups   []struct {
				Name string `json:"groupname"`
			} `json:"groups"`
		} `json:"clients"`
		Groups []struct {
			Name    string    `json:"groupname"`
			Roles   []roleRef `json:"roles"`
			Clients []struct {
				Username string `json:"username"`
			} `json:"clients"`
		} `json:"groups"`
		Roles []struct {
			Name string `json:"rolename"`
			ACLs []struct {
				Type     string `json:"acltype"`
				Topic    string `json:"topic"`
				Priority int    `json:"priority"`
				Allow    bool   `json:"allow"`
			} `json:"acls"`
		} `json:"roles"`
	}
	if err := json.Unmarshal(data, &state); err != nil {
		return nil, fmt.Errorf("dynamic-security.json: %w", err)
	}
	roles := func(rs []roleRef) string {
		var out []string
		for _, r := range rs {
			out = append(out, fmt.Sprintf("%s@%d", r.Name, r.Priority))
		}
		sort.Strings(out)
		return strings.Join(out, ",")
	}
	entries := map[string]string{}
	for _, c := range state.Clients {
		var groups []string
		for _, g := range c.Groups {
			groups = append(groups, g.Name)
		}
		sort.Strings(groups)
		entries["client "+c.Username] = fmt.Sprintf("clientid=%s roles=[%s] groups=[%s]", c.ClientID, roles(c.Roles), strings.Join(groups, ","))
	}
	for _, g := range state.Groups {
		var members []string
		for _, c := range g.Clients {
			members = append(members, c.Username)
		}
		sort.Strings(members)
		entries["group "+g.Name] = fmt.Sprintf("roles=[%s] clients=[%s]", roles(g.Roles), strings.Join(members, ","))
	}
	for _, r := range state.Roles {
		var acls []string
		for _, a := range r.ACLs {
			acls = append(acls, fmt.Sprintf("%s %s %d %v", a.Type, a.Topic, a.Priority, a.Allow))
		}
		sort.Strings(acls)
		entries["role "+r.Name] = strings.Join(acls, "; ")
	}
	return entries, nil
}

// missingFrom lists the entries of want that got does not hold identically.
func missingFrom(want, got map[string]string) []string {
	var out []string
	for k, v := range want {
		if g, ok := got[k]; !ok {
			out = append(out, k+": missing")
		} else if g != v {
			out = append(out, fmt.Sprintf("%s: %s, want %s", k, g, v))
		}
	}
	slices.Sort(out)
	return out
}

// conditionLog records every status of the chaos Agents the API server stored, from a watch (a
// watch delivers every write, so a condition that was False for a moment is seen even when a
// poll would miss it).
type conditionLog struct {
	mu      sync.Mutex
	entries map[string][]conditionEntry // by Agent name
	stop    context.CancelFunc
	done    chan struct{}
}

type conditionEntry struct {
	at                            time.Time
	ready, aclsSynced             metav1.ConditionStatus
	readyReason, aclsSyncedReason string
}

// watchConditions starts recording the chaos namespace's Agents' Ready and ACLsSynced.
func (f *fleet) watchConditions(ctx context.Context) *conditionLog {
	f.t.Helper()
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Client.Scheme()})
	if err != nil {
		f.t.Fatal(err)
	}
	w, err := wc.Watch(ctx, &a2av1.AgentList{}, client.InNamespace(chaosNS))
	if err != nil {
		f.t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	l := &conditionLog{entries: map[string][]conditionEntry{}, stop: stop, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		defer w.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case ev, ok := <-w.ResultChan():
				if !ok {
					return
				}
				a, isAgent := ev.Object.(*a2av1.Agent)
				if !isAgent || (ev.Type != watch.Added && ev.Type != watch.Modified) {
					continue
				}
				e := conditionEntry{at: time.Now(), ready: metav1.ConditionUnknown, aclsSynced: metav1.ConditionUnknown}
				if c := meta.FindStatusCondition(a.Status.Conditions, a2av1.ConditionReady); c != nil {
					e.ready, e.readyReason = c.Status, c.Reason
				}
				if c := meta.FindStatusCondition(a.Status.Conditions, a2av1.ConditionACLsSynced); c != nil {
					e.aclsSynced, e.aclsSyncedReason = c.Status, c.Reason
				}
				l.mu.Lock()
				l.entries[a.Name] = append(l.entries[a.Name], e)
				l.mu.Unlock()
			}
		}
	}()
	f.t.Cleanup(l.close)
	return l
}

func (l *conditionLog) close() {
	l.stop()
	<-l.done
}

// wentFalseAndBack reports, per Agent, whether a status written after since had the condition
// False and a later one True (and when each was first seen), and the reasons seen.
func (l *conditionLog) wentFalseAndBack(agent string, since time.Time, aclsSynced bool) (falseAt, trueAt time.Time, reasons []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.entries[agent] {
		if e.at.Before(since) {
			continue
		}
		status, reason := e.ready, e.readyReason
		if aclsSynced {
			status, reason = e.aclsSynced, e.aclsSyncedReason
		}
		if !slices.Contains(reasons, reason) {
			reasons = append(reasons, reason)
		}
		switch {
		case status == metav1.ConditionFalse && falseAt.IsZero():
			falseAt = e.at
		case status == metav1.ConditionTrue && !falseAt.IsZero() && trueAt.IsZero():
			trueAt = e.at
		}
	}
	return falseAt, trueAt, reasons
}

// checkFlipped fails the test unless every named Agent's ACLsSynced and Ready went False after
// since, said BrokerStateLost, and went True again (status says the truth through a broker state
// loss), and logs when.
func (l *conditionLog) checkFlipped(t *testing.T, since time.Time, agents ...string) {
	t.Helper()
	for _, name := range agents {
		for _, cond := range []string{a2av1.ConditionACLsSynced, a2av1.ConditionReady} {
			falseAt, trueAt, reasons := l.wentFalseAndBack(name, since, cond == a2av1.ConditionACLsSynced)
			switch {
			case falseAt.IsZero():
				t.Errorf("Agent %s: %s never went False after the broker lost its state (reasons seen: %v): status claimed a registration the broker no longer had", name, cond, reasons)
			case trueAt.IsZero():
				t.Errorf("Agent %s: %s went False %.1fs after the loss and never True again (reasons seen: %v)", name, cond, falseAt.Sub(since).Seconds(), reasons)
			case !slices.Contains(reasons, "BrokerStateLost"):
				t.Errorf("Agent %s: %s went False and True again, but never said BrokerStateLost (reasons seen: %v)", name, cond, reasons)
			default:
				t.Logf("Agent %s: %s False %.1fs after the loss, True again %.1fs after it (reasons %v)", name, cond, falseAt.Sub(since).Seconds(), trueAt.Sub(since).Seconds(), reasons)
			}
		}
	}
}
