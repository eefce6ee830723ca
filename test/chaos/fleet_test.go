// Package chaos breaks an installed a2a-fleet on purpose, with real processes only: the rendered
// quickstart runs as processes on a real control plane (test/deploy/installed), the agents are
// Agent workloads whose Deployments run as pods (chaosagent, an SDK responder that journals every
// execution), and a load of single- and multi-turn requests runs through the broker and the
// conversation service while the suite restarts the broker, wipes its state, kills service
// replicas and the operator with SIGKILL, and rotates credentials. Every scenario reports requests
// completed, errored, lost and duplicated, and the bar is 0 lost, 0 duplicated and 0 frozen
// clients; recovery times go to docs/reliability.md.
package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/test/deploy/installed"
	"github.com/a2a-fleet/a2a-fleet/test/deploy/localcluster"
	"github.com/a2a-fleet/a2a-fleet/test/deploy/render"
)

// The chaos agents live in this namespace, org and unit.
const (
	chaosNS   = "chaos"
	chaosOrg  = "chaos"
	chaosUnit = "lab"
	// chaosImage stands for an image of test/chaos/chaosagent (no Dockerfile target: it is the
	// suite's own agent).
	chaosImage = "a2a-fleet/chaos-agent"
)

var agentBuild struct {
	sync.Once
	err error
}

// fleet is an installed a2a-fleet with the chaos agents running as workloads.
type fleet struct {
	*installed.Stack
	t         *testing.T
	workloads map[string]*localcluster.DeploymentController
	requester *a2amqtt.Requester
	conn      *a2amqtt.Conn
}

// fleetManifests are the chaos namespace, a policy that gates the "gated" agent, and the agents:
// "client" (the requester identity), "direct" (reached directly, with a persistent MQTT session:
// requests sent while it restarts wait on the broker) and "gated" (behind the conversation
// service, clean session: the service answers -32004 while it is away), the last two as
// workloads of chaosImage with the SDK's readiness probe (ready once connected).
func fleetManifests() string {
	agent := func(name, labels, workload string) string {
		return fmt.Sprintf(`apiVersion: a2a.fleet.dev/v1alpha1
kind: Agent
metadata: {name: %s, namespace: %s, labels: {%s}}
spec:
  orgID: %s
  unitID: %s
  card: {name: %s, description: chaos suite agent}
  callers: {scope: SameUnit}
%s---
`, name, chaosNS, labels, chaosOrg, chaosUnit, name, workload)
	}
	workload := func(sessionExpiry string) string {
		return `  workload:
    template:
      spec:
        containers:
        - name: agent
          image: ` + chaosImage + `:dev
          args: ["--health-addr=:8081"]
          env:
          - {name: CHAOS_JOURNAL, value: /var/log/chaos/journal}
          - {name: A2A_SESSION_EXPIRY, value: "` + sessionExpiry + `"}
          - {name: A2A_CONNECT_TIMEOUT, value: 1m}
          ports: [{name: health, containerPort: 8081}]
          readinessProbe: {httpGet: {path: /readyz, port: health}, periodSeconds: 2}
          volumeMounts:
          - {name: journal, mountPath: /var/log/chaos}
        volumes:
        - {name: journal, emptyDir: {}}
`
	}
	return `apiVersion: v1
kind: Namespace
metadata: {name: ` + chaosNS + `}
---
apiVersion: a2a.fleet.dev/v1alpha1
kind: ConversationPolicy
metadata: {name: governed, namespace: ` + chaosNS + `}
spec:
  agentSelector: {matchLabels: {chaos: gated}}
  maxConcurrentTasksPerContext: 1
---
` + agent("client", "role: client", "") + agent("direct", "role: agent", workload("10m")) + agent("gated", "role: agent, chaos: gated", workload("0s"))
}

// newFleet installs objs (a rendered quickstart) and the chaos fleet, and connects the requester.
func newFleet(ctx context.Context, t *testing.T, objs []*unstructured.Unstructured) *fleet {
	t.Helper()
	return newFleetWith(ctx, t, objs, nil)
}

// newFleetWith is newFleet with more images (for what an overlay adds).
func newFleetWith(ctx context.Context, t *testing.T, objs []*unstructured.Unstructured, images map[string]localcluster.Image) *fleet {
	t.Helper()
	s := installed.InstallWith(ctx, t, objs, images)
	s.DumpOnFailure()
	agentBuild.Do(func() { agentBuild.err = localcluster.Build(s.Root, s.Bin, "./test/chaos/chaosagent") })
	if agentBuild.err != nil {
		t.Fatal(agentBuild.err)
	}
	s.Cluster.Images[chaosImage] = localcluster.Image{Entrypoint: []string{filepath.Join(s.Bin, "chaosagent")}, User: localcluster.Nonroot}
	f := &fleet{Stack: s, t: t, workloads: map[string]*localcluster.DeploymentController{}}
	manifests, err := render.Decode([]byte(fleetManifests()))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Cluster.Apply(ctx, manifests, chaosNS); err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	for _, name := range []string{"direct", "gated"} {
		f.workloads[name] = s.Cluster.RunDeployment(wctx, chaosNS, name+"-agent")
	}
	t.Cleanup(func() {
		if t.Failed() {
			for name, w := range f.workloads {
				for _, p := range w.AllPods() {
					t.Logf("----- workload %s\n%s", name, tail(p.Logs(), 4000))
				}
			}
		}
	})
	s.WaitAgentsReady(ctx, chaosNS, 3*time.Minute)
	user, pass := s.Credentials(ctx, chaosNS, "client")
	f.conn, err = a2amqtt.Connect(ctx, a2amqtt.Config{BrokerURL: s.BrokerURL, Username: user, Password: pass, Agent: ref("client")})
	if err != nil {
		t.Fatalf("requester connect: %v", err)
	}
	t.Cleanup(func() { _ = f.conn.Close(context.Background()) })
	// The SDK's default retry policy (15 s first-reply timeout, 3 attempts), as an application uses it.
	if f.requester, err = a2amqtt.NewRequester(ctx, f.conn, a2amqtt.RequesterOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitServing(ctx, 2*time.Minute)
	return f
}

func ref(agent string) a2amqtt.AgentRef {
	return a2amqtt.AgentRef{Org: chaosOrg, Unit: chaosUnit, Agent: agent}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// waitServing sends probes until both agents answer (the first request after a start or a fault).
func (f *fleet) waitServing(ctx context.Context, timeout time.Duration) time.Duration {
	f.t.Helper()
	start := time.Now()
	for _, agent := range []string{"direct", "gated"} {
		for {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			res, err := sendOnce(pctx, f.requester, agent, "", "", "echo:probe")
			cancel()
			if err == nil && a2amqtt.ResultText(res) == "probe" {
				break
			}
			if time.Since(start) > timeout {
				f.t.Fatalf("%s does not answer %s after the start or fault: %v", agent, time.Since(start).Round(time.Second), err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	return time.Since(start)
}

// journals reads every execution the chaos agents recorded: message id -> "pod time task" of each
// execution.
func (f *fleet) journals() map[string][]string {
	out := map[string][]string{}
	for _, w := range f.workloads {
		for _, p := range w.AllPods() {
			data, err := os.ReadFile(filepath.Join(p.VolumeDir("journal"), "journal"))
			if err != nil {
				continue
			}
			for _, line := range strings.Split(string(data), "\n") {
				fields := strings.Fields(line)
				if len(fields) >= 3 {
					out[fields[2]] = append(out[fields[2]], p.Name+" "+fields[0]+" task "+fields[1])
				}
			}
		}
	}
	return out
}

// checkNoFrozenProcess: every pod of the install is ready and answers, no container restarted on
// its own, and both agents answer through the bus.
func (f *fleet) checkNoFrozenProcess(ctx context.Context) {
	f.t.Helper()
	for name, pods := range f.Pods {
		for _, p := range pods {
			if err := p.WaitReady(ctx, 90*time.Second); err != nil {
				f.t.Errorf("frozen or unready %s: %v", name, err)
			}
		}
	}
	for name, w := range f.workloads {
		if len(w.Pods()) == 0 {
			f.t.Errorf("workload %s has no pod (%v)", name, w.Err())
		}
	}
	f.waitServing(ctx, 90*time.Second)
}
