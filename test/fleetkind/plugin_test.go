package fleetkind

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/a2a-fleet/a2a-fleet/test/cluster"
)

// The decision-table plugin's diagnostics on the broker pod (FLEETKIND_BROKER_ENV): a profile of
// the new-Agent batch (A2A_FLEET_TABLE_PROFILE_DIR) copied into the profiles folder, and a count
// of the control messages and checks the batch brought (A2A_FLEET_TABLE_TRACE).

// brokerEnvValue is the value of K in FLEETKIND_BROKER_ENV ("" when not set).
func (r *bench) brokerEnvValue(k string) string {
	for _, kv := range r.s.brokerEnv {
		if name, v, _ := strings.Cut(kv, "="); name == k {
			return v
		}
	}
	return ""
}

// brokerPod is the name of the one ready broker pod.
func (r *bench) brokerPod(ctx context.Context) string {
	pods, err := r.env.Pods(ctx, cluster.Namespace, "app.kubernetes.io/name=mosquitto")
	if err != nil || len(pods) != 1 {
		r.b.Fatalf("want one ready broker pod: %d %v", len(pods), err)
	}
	return pods[0].Name
}

// profileWindow is a plugin profile under way (nil: none).
type profileWindow struct {
	r    *bench
	ctx  context.Context
	pod  string
	dir  string
	name string
}

// pluginProfile starts a profile window of the plugin when A2A_FLEET_TABLE_PROFILE_DIR is set.
func (r *bench) pluginProfile(ctx context.Context, name string) *profileWindow {
	dir := r.brokerEnvValue("A2A_FLEET_TABLE_PROFILE_DIR")
	if dir == "" || r.s.profiles == "" {
		return nil
	}
	w := &profileWindow{r: r, ctx: ctx, pod: r.brokerPod(ctx), dir: dir, name: name}
	if _, err := r.env.Exec(ctx, cluster.Namespace, w.pod, "mosquitto", "sh", "-c", "rm -f "+dir+"/*.pprof "+dir+"/*.txt; touch "+dir+"/start"); err != nil {
		r.b.Logf("plugin profile: %v", err)
		return nil
	}
	time.Sleep(1500 * time.Millisecond) // the plugin looks once a second
	return w
}

// stop ends the window and copies its files into the profiles folder.
func (w *profileWindow) stop() {
	if w == nil {
		return
	}
	r, ctx := w.r, w.ctx
	if _, err := r.env.Exec(ctx, cluster.Namespace, w.pod, "mosquitto", "touch", w.dir+"/stop"); err != nil {
		r.b.Logf("plugin profile: %v", err)
		return
	}
	time.Sleep(2500 * time.Millisecond)
	list, err := r.env.Exec(ctx, cluster.Namespace, w.pod, "mosquitto", "sh", "-c", "cd "+w.dir+" && ls *.pprof *.txt")
	if err != nil {
		r.b.Logf("plugin profile: %v", err)
		return
	}
	for _, f := range strings.Fields(list) {
		out, err := r.env.Exec(ctx, cluster.Namespace, w.pod, "mosquitto", "base64", "-w0", w.dir+"/"+f)
		if err != nil {
			r.b.Logf("plugin profile %s: %v", f, err)
			continue
		}
		data, err := base64.StdEncoding.DecodeString(strings.TrimSpace(out))
		if err != nil {
			r.b.Logf("plugin profile %s: %v", f, err)
			continue
		}
		path := filepath.Join(r.s.profiles, "plugin-"+w.name+"-"+f)
		if err := os.WriteFile(path, data, 0o644); err != nil {
			r.b.Fatal(err)
		}
		if strings.HasSuffix(f, ".txt") {
			r.logf("plugin %s: %s", w.name, strings.TrimSpace(string(data)))
		}
	}
	r.b.Logf("plugin profiles written to %s (plugin-%s-*)", r.s.profiles, w.name)
}

var traceLine = regexp.MustCompile(`a2a-fleet table trace: control from (\S+) op=(\S+) commands=(\d+) \[([^\]]*)\] in=(\d+)B out=(\d+)B took=(\S+); since the last: (\d+) CONNECT, checks publish=(\d+) receive=(\d+) subscribe=(\d+) unsubscribe=(\d+)`)
var roundLine = regexp.MustCompile(`a2a-fleet table trace: disk round roles=(\d+) groups=(\d+) clients=(\d+), (\d+) page writes, took=(\S+)`)

// traceSummary counts the plugin's trace lines since the batch's start (A2A_FLEET_TABLE_TRACE):
// control messages by op with their bytes, the commands, the checks and the disk rounds.
func (r *bench) traceSummary(ctx context.Context, what string, size int, since time.Time) {
	if r.brokerEnvValue("A2A_FLEET_TABLE_TRACE") == "" {
		return
	}
	out, err := r.env.KubectlRun(ctx, "logs", "-n", cluster.Namespace, r.brokerPod(ctx), "-c", "mosquitto", "--since-time="+since.Add(-time.Second).UTC().Format(time.RFC3339))
	if err != nil {
		r.b.Logf("trace: %v", err)
		return
	}
	type opCount struct {
		n, in, out int
		took       time.Duration
	}
	ops := map[string]*opCount{}
	commands := map[string]int{}
	var checks [5]int
	var rounds, pages int
	var roundTook time.Duration
	atoi := func(s string) int { n, _ := strconv.Atoi(s); return n }
	for _, line := range strings.Split(out, "\n") {
		if m := traceLine.FindStringSubmatch(line); m != nil {
			c := ops[m[2]]
			if c == nil {
				c = &opCount{}
				ops[m[2]] = c
			}
			d, _ := time.ParseDuration(m[7])
			c.n, c.in, c.out, c.took = c.n+1, c.in+atoi(m[5]), c.out+atoi(m[6]), c.took+d
			for _, op := range strings.Split(m[4], ",") {
				if op != "" {
					commands[op]++
				}
			}
			for i := range 5 {
				checks[i] += atoi(m[8+i])
			}
		}
		if m := roundLine.FindStringSubmatch(line); m != nil {
			d, _ := time.ParseDuration(m[5])
			rounds, pages, roundTook = rounds+1, pages+atoi(m[4]), roundTook+d
		}
	}
	n := float64(r.s.changes)
	var parts []string
	names := make([]string, 0, len(ops))
	for k := range ops {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		c := ops[k]
		parts = append(parts, fmt.Sprintf("%s %.1f (in %.0f B, out %.0f B, %.0f µs in the plugin)", k, float64(c.n)/n, float64(c.in)/float64(c.n), float64(c.out)/float64(c.n), float64(c.took.Microseconds())/float64(c.n)))
	}
	var cmds []string
	for k, v := range commands {
		cmds = append(cmds, fmt.Sprintf("%s %.1f", k, float64(v)/n))
	}
	sort.Strings(cmds)
	r.logf("plugin trace, %s at %d, per change: control messages %s; commands %s; CONNECT %.1f, checks publish %.1f receive %.1f subscribe %.1f unsubscribe %.1f; disk rounds %.1f (%.1f page writes, %.0f µs each)",
		what, size, strings.Join(parts, ", "), strings.Join(cmds, ", "), float64(checks[0])/n, float64(checks[1])/n, float64(checks[2])/n, float64(checks[3])/n, float64(checks[4])/n,
		float64(rounds)/n, float64(pages)/max(float64(rounds), 1), float64(roundTook.Microseconds())/max(float64(rounds), 1))
}
