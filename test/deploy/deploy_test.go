// Package deploy is the deployment e2e: it installs what users apply (config/quickstart rendered
// by kustomize, and the Helm chart) on a real kube-apiserver with RBAC, runs every rendered
// Deployment's pods as processes of the Dockerfile's binaries with ServiceAccount-token
// kubeconfigs and the manifests' args, Mosquitto from the rendered configuration with dynsec
// initialised by the rendered init container from the Secret the operator generates, applies the
// samples and chats through the conversation service with a2actl. Any RBAC refusal in the audit
// log fails it.
package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/a2a-fleet/a2a-fleet/test/deploy/installed"
	"github.com/a2a-fleet/a2a-fleet/test/deploy/localcluster"
	"github.com/a2a-fleet/a2a-fleet/test/deploy/render"
)

// The Dockerfile is the one image recipe: it builds both binaries with the flags test/deploy
// builds them with, has a target per image whose ENTRYPOINT is the binary the manifests run, and
// `make docker-build` tags the images the manifests name.
func TestDockerfileBuildsWhatTheManifestsRun(t *testing.T) {
	root, err := render.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	read := func(name string) string {
		data, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	dockerfile, makefile := read("Dockerfile"), read("Makefile")
	if !strings.Contains(dockerfile, localcluster.DockerfileBuild) {
		t.Errorf("Dockerfile does not build with %q (the flags test/deploy uses)", localcluster.DockerfileBuild)
	}
	objs, err := render.Kustomize(root, "config/quickstart")
	if err != nil {
		t.Fatal(err)
	}
	images := map[string]string{} // image -> target
	for _, target := range []struct{ target, binary, image, makeVar string }{
		{"manager", "manager", "a2a-fleet/operator:dev", "IMG"},
		{"conversation-service", "conversation-service", "a2a-fleet/conversation-service:dev", "SERVICE_IMG"},
	} {
		stage := regexp.MustCompile(`(?ms)^FROM \S+ AS ` + regexp.QuoteMeta(target.target) + `\n.*?^ENTRYPOINT \["/` + regexp.QuoteMeta(target.binary) + `"\]`)
		if !stage.MatchString(dockerfile) {
			t.Errorf("Dockerfile has no target %s with ENTRYPOINT [\"/%s\"]", target.target, target.binary)
		}
		if !strings.Contains(dockerfile, "/out/"+target.binary+" /"+target.binary) {
			t.Errorf("Dockerfile target %s does not copy the built /out/%s", target.target, target.binary)
		}
		if !regexp.MustCompile(`(?m)^`+target.makeVar+` \?= `+regexp.QuoteMeta(target.image)+`$`).MatchString(makefile) ||
			!strings.Contains(makefile, "--target "+target.target+" -t $("+target.makeVar+")") {
			t.Errorf("make docker-build does not build target %s as %s=%s", target.target, target.makeVar, target.image)
		}
		images[target.image] = target.target
	}
	used := 0
	for _, o := range objs {
		if o.GetKind() != "Deployment" {
			continue
		}
		containers := containerImages(o.Object)
		for _, image := range containers {
			if strings.HasPrefix(image, "a2a-fleet/") {
				if _, ok := images[image]; !ok {
					t.Errorf("%s runs image %s, which no Dockerfile target builds", o.GetName(), image)
				}
				used++
			}
		}
	}
	if used != 2 {
		t.Errorf("the quickstart runs %d a2a-fleet images, want 2 (operator and conversation service)", used)
	}
}

// containerImages lists the images of a Deployment's init containers and containers.
func containerImages(obj map[string]any) []string {
	spec, _ := obj["spec"].(map[string]any)
	tmpl, _ := spec["template"].(map[string]any)
	podSpec, _ := tmpl["spec"].(map[string]any)
	var images []string
	for _, key := range []string{"initContainers", "containers"} {
		list, _ := podSpec[key].([]any)
		for _, c := range list {
			if m, ok := c.(map[string]any); ok {
				images = append(images, fmt.Sprint(m["image"]))
			}
		}
	}
	return images
}

func TestQuickstartInstallWorks(t *testing.T) {
	root, err := render.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := render.Kustomize(root, "config/quickstart")
	if err != nil {
		t.Fatal(err)
	}
	installAndChat(t, objs)
}

func TestHelmInstallWorks(t *testing.T) {
	root, err := render.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := render.Helm(root)
	if err != nil {
		t.Fatal(err)
	}
	// Helm installs into an existing namespace (helm install --create-namespace makes it).
	ns, err := render.Decode([]byte("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: " + render.Namespace + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	installAndChat(t, append(ns, objs...))
}

func installAndChat(t *testing.T, objs []*unstructured.Unstructured) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	s := installed.Install(ctx, t, objs)
	s.DumpOnFailure()

	s.ApplySamples(ctx, "default")
	agents := s.WaitAgentsReady(ctx, "default", 2*time.Minute)
	s.StartExampleAgents(ctx, agents)
	waitOnline(ctx, t, s, "acme/demo/echo", "acme/demo/confirm", "acme/demo/memory-agent")

	// Direct (no policy governs echo).
	out, err := s.A2actl(ctx, "default", "console", "send", "acme/demo/echo", "hello fleet", "--timeout", "30s")
	if err != nil || !strings.Contains(out, "hello fleet") {
		t.Fatalf("a2actl send echo: %v\n%s", err, out)
	}
	// Through the conversation service: input-required, then the answer in the same task.
	out, err = s.A2actl(ctx, "default", "console", "send", "acme/demo/confirm", "rename the staging bucket", "--timeout", "30s")
	task, contextID, state, ok := installed.ParseTask(out)
	if err != nil || !ok || state != "input-required" {
		t.Fatalf("a2actl send confirm: %v (state %q)\n%s", err, state, out)
	}
	out, err = s.A2actl(ctx, "default", "console", "send", "acme/demo/confirm", "go ahead", "--approve", "--task-id", task, "--context-id", contextID, "--timeout", "30s")
	if _, _, state, ok := installed.ParseTask(out); err != nil || !ok || state != "completed" {
		t.Fatalf("a2actl answer confirm: %v (state %q)\n%s", err, state, out)
	}
	t.Logf("chat with acme/demo/confirm through the service: input-required, then completed (task %s)", task)
	// History kept by the service: the memory agent reads the earlier turn of the context.
	if out, err = s.A2actl(ctx, "default", "console", "send", "acme/demo/memory-agent", "first", "--timeout", "30s"); err != nil {
		t.Fatalf("a2actl send memory: %v\n%s", err, out)
	}
	_, memCtx, _, _ := installed.ParseTask(out)
	if memCtx == "" {
		memCtx = contextFromText(out)
	}
	out, err = s.A2actl(ctx, "default", "console", "send", "acme/demo/memory-agent", "second", "--context-id", memCtx, "--timeout", "30s")
	if err != nil || !strings.Contains(out, `Earlier in this conversation you said: "first"`) {
		t.Fatalf("memory agent did not see the first turn of context %s: %v\n%s", memCtx, err, out)
	}

	checkHealthy(ctx, t, s)
}

// waitOnline polls `a2actl agents` until every agent's retained card says online.
func waitOnline(ctx context.Context, t *testing.T, s *installed.Stack, agents ...string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		out, err := s.A2actl(ctx, "default", "console", "agents", "--org", "acme", "--wait", "500ms", "--json")
		var rows []struct{ Agent, Status string }
		if err == nil {
			err = json.Unmarshal([]byte(out), &rows)
		}
		online := map[string]bool{}
		for _, r := range rows {
			online[r.Agent] = r.Status == "online"
		}
		missing := []string{}
		for _, a := range agents {
			if !online[a] {
				missing = append(missing, a)
			}
		}
		if err == nil && len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("agents not online after a minute: %v %v\n%s", missing, err, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

var contextRe = regexp.MustCompile(`context[ :]+([0-9a-f-]{36})`)

func contextFromText(out string) string {
	if m := contextRe.FindStringSubmatch(out); m != nil {
		return m[1]
	}
	return ""
}

// checkHealthy: no RBAC refusal in the audit log, no "forbidden" in any log, no container that
// restarted on its own, every pod ready, one operator replica holds the leader Lease.
func checkHealthy(ctx context.Context, t *testing.T, s *installed.Stack) {
	t.Helper()
	forbidden, total, err := s.Cluster.Forbidden()
	if err != nil {
		t.Fatal(err)
	}
	if total == 0 {
		t.Fatal("the audit log holds no ServiceAccount request: the RBAC check would prove nothing")
	}
	for _, e := range forbidden {
		t.Errorf("RBAC refused: %s", e)
	}
	t.Logf("audit log: %d requests by the ServiceAccounts, %d refused", total, len(forbidden))
	for name, pods := range s.Pods {
		for _, p := range pods {
			if strings.Contains(strings.ToLower(p.Logs()), "forbidden") {
				t.Errorf("%s logged \"forbidden\" (an RBAC gap)", p.Name)
			}
			for ct, n := range p.Restarts() {
				if n > 0 {
					t.Errorf("%s: container %s restarted %d times on its own", p.Name, ct, n)
				}
			}
			if err := p.Probe(ctx, true); err != nil {
				t.Errorf("%s not ready at the end: %v", name, err)
			}
		}
	}
	lease := &coordinationv1.Lease{}
	if err := s.Cluster.Client.Get(ctx, client.ObjectKey{Namespace: installed.Namespace, Name: "a2a-fleet-operator.a2a.fleet.dev"}, lease); err != nil {
		t.Errorf("leader election Lease: %v", err)
	} else if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
		t.Errorf("leader election Lease has no holder")
	}
}

// The Dockerfile's build stage compiles with only what it copies into the image: the test
// copies exactly the sources its COPY lines name into an empty folder and runs its build command
// there (as `docker build` would, minus the base image), so a new dependency outside those
// folders fails here instead of in the image build that cannot run on this machine.
func TestDockerfileBuildStageBuildsFromItsCopies(t *testing.T) {
	root, err := render.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.TempDir()
	copied := 0
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 3 || fields[0] != "COPY" || strings.HasPrefix(fields[1], "--") {
			continue
		}
		dest := fields[len(fields)-1]
		for _, src := range fields[1 : len(fields)-1] {
			to := filepath.Join(ctx, dest)
			if !strings.HasSuffix(dest, "/") || dest == "./" {
				to = filepath.Join(ctx, dest, filepath.Base(src))
			}
			if out, err := exec.Command("cp", "-r", filepath.Join(root, src), to).CombinedOutput(); err != nil {
				t.Fatalf("COPY %s %s: %v %s", src, dest, err, out)
			}
			copied++
		}
	}
	if copied < 3 {
		t.Fatalf("found only %d COPY sources in the Dockerfile", copied)
	}
	// The RUN line's command, with the image's /out replaced by a folder here.
	out := t.TempDir()
	args := []string{"build", "-trimpath", "-ldflags=-s -w", "-o", out + "/", "./cmd/manager", "./cmd/conversation-service"}
	if !strings.Contains(string(data), localcluster.DockerfileBuild) {
		t.Fatalf("the Dockerfile's build command is not %q", localcluster.DockerfileBuild)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = ctx
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOTOOLCHAIN=local")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the Dockerfile's build fails with only its COPY sources: %v\n%s", err, b)
	}
	for _, bin := range []string{"manager", "conversation-service"} {
		if _, err := os.Stat(filepath.Join(out, bin)); err != nil {
			t.Errorf("the build made no %s: %v", bin, err)
		}
	}
}
