package fleetkind

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/hostload"
	"github.com/a2a-fleet/a2a-fleet/test/cluster"
)

// The operator's log lines the restart measurement reads (internal/registration, publisher.go).
const (
	cardReadMsg    = "read the agents' retained cards"
	republishedMsg = "republished registration cards missing from the broker"
	brokerDropMsg  = "Outgoing messages are being dropped"
)

// cardsAfterRestart reports what the operator's card connection read after the broker restart
// at since: the retained cards it received against the Agents it looked for, and the cards its
// missing-card scan republished after the grace. With the disk kept every card is on the broker,
// so the read must find them all (the scan must not be needed); from an empty disk the scan
// republishes those that no agent put back.
func (r *bench) cardsAfterRestart(ctx context.Context, since time.Time, emptyDisk bool, suffix string) {
	b := r.b
	var agents a2av1.AgentList
	if err := r.env.Client.List(ctx, &agents); err != nil {
		b.Fatal(err)
	}
	var read map[string]any
	err := cluster.Poll(ctx, 3*time.Minute, "the operator's card read after the restart", func(ctx context.Context) (bool, string, error) {
		lines, err := r.operatorLog(ctx, since, cardReadMsg)
		if err != nil || len(lines) == 0 {
			return false, "no line yet", err
		}
		read = lines[len(lines)-1]
		return true, "", nil
	})
	if err != nil {
		b.Fatal(err)
	}
	// The scan runs a grace (10 s) after the connection. With the disk kept it finds nothing
	// missing and says nothing; from an empty disk it says how many it republished when done.
	var lines []map[string]any
	if emptyDisk {
		err = cluster.Poll(ctx, 5*time.Minute, "the operator's missing-card scan after the restart", func(ctx context.Context) (bool, string, error) {
			lines, err = r.operatorLog(ctx, since, republishedMsg)
			return len(lines) > 0, "no line yet", err
		})
	} else {
		time.Sleep(20 * time.Second)
		lines, err = r.operatorLog(ctx, since, republishedMsg)
	}
	if err != nil {
		b.Fatal(err)
	}
	republished := 0.0
	for _, l := range lines {
		n, _ := l["cards"].(float64)
		republished += n
	}
	looked, _ := read["agents"].(float64)
	found, _ := read["cards"].(float64)
	seconds, _ := read["seconds"].(float64)
	drops := r.brokerLogCount(ctx, since, brokerDropMsg)
	r.logf("cards after the restart (load %s): the operator read %.0f retained cards of %.0f Agents (%d in the cluster) in %.2f s; the missing-card scan republished %.0f; broker log lines %q since the deletion: %d",
		hostload.Average(), found, looked, len(agents.Items), seconds, republished, brokerDropMsg, drops)
	b.ReportMetric(found, "cards-read"+suffix)
	b.ReportMetric(republished, "cards-republished"+suffix)
	if int(looked) != len(agents.Items) {
		b.Errorf("the card read looked for %.0f Agents' cards, the cluster has %d Agents", looked, len(agents.Items))
	}
	if !emptyDisk && (found != looked || republished != 0) {
		b.Errorf("with the broker's disk kept the operator read %.0f of %.0f cards and republished %.0f: every card was on the broker", found, looked, republished)
	}
	if emptyDisk && found+republished < looked {
		b.Errorf("from an empty disk the operator read %.0f cards and republished %.0f of %.0f", found, republished, looked)
	}
}

// operatorLog returns the operator pods' JSON log lines since since whose message is msg.
func (r *bench) operatorLog(ctx context.Context, since time.Time, msg string) ([]map[string]any, error) {
	pods, err := r.env.Clientset.CoreV1().Pods(cluster.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=operator"})
	if err != nil {
		return nil, err
	}
	var out []map[string]any
	for _, p := range pods.Items {
		data, err := r.podLog(ctx, &p, "manager", since)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			if !bytes.Contains(sc.Bytes(), []byte(msg)) {
				continue
			}
			var line map[string]any
			if json.Unmarshal(sc.Bytes(), &line) == nil && line["msg"] == msg {
				out = append(out, line)
			}
		}
	}
	return out, nil
}

// brokerLogCount counts the broker pods' log lines since since that contain text.
func (r *bench) brokerLogCount(ctx context.Context, since time.Time, text string) int {
	pods, err := r.env.Clientset.CoreV1().Pods(cluster.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=mosquitto"})
	if err != nil {
		r.b.Fatal(err)
	}
	n := 0
	for _, p := range pods.Items {
		data, err := r.podLog(ctx, &p, "mosquitto", since)
		if err != nil {
			r.logf("broker log of %s: %v", p.Name, err)
			continue
		}
		n += strings.Count(string(data), text)
	}
	return n
}

func (r *bench) podLog(ctx context.Context, p *corev1.Pod, container string, since time.Time) ([]byte, error) {
	t := metav1.NewTime(since)
	data, err := r.env.Clientset.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: container, SinceTime: &t}).DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("log of %s/%s: %w", p.Name, container, err)
	}
	return data, nil
}

// brokerCrashes fails the benchmark when a broker container restarted (a crash, or a liveness
// probe's kill) since its pod started: a restart of the pod must not be followed by more.
func (r *bench) brokerCrashes(ctx context.Context, suffix string) {
	restarts, err := r.env.Restarts(ctx, cluster.Namespace, "app.kubernetes.io/name=mosquitto")
	if err != nil {
		r.b.Fatal(err)
	}
	total := int32(0)
	for _, n := range restarts {
		total += n
	}
	r.logf("broker container restarts after the restart: %v", restarts)
	r.b.ReportMetric(float64(total), "broker-container-restarts"+suffix)
	if total != 0 {
		r.b.Errorf("the broker's container restarted %d times after its pod was recreated (%v): it crashed", total, restarts)
	}
}
