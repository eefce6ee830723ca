package chaos

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/a2a-fleet/a2a-fleet/test/cluster"
)

// env is the cluster the suite breaks things on (E2E_CLUSTER_KUBECONFIG; make test's kind cluster).
var env *cluster.Env

func TestMain(m *testing.M) {
	ctrl.SetLogger(logr.Discard())
	var err error
	if env, err = cluster.FromEnv(); err != nil {
		fmt.Fprintln(os.Stderr, "test/chaos:", err)
		os.Exit(1)
	}
	version, err := env.Clientset.Discovery().ServerVersion()
	if err != nil {
		fmt.Fprintln(os.Stderr, "test/chaos: the cluster does not answer:", err)
		os.Exit(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	nodes, _ := env.Clientset.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	cancel()
	var runtimes []string
	if nodes != nil {
		for _, n := range nodes.Items {
			runtimes = append(runtimes, n.Name+" "+n.Status.NodeInfo.KubeletVersion+" "+n.Status.NodeInfo.ContainerRuntimeVersion)
		}
	}
	fmt.Printf("cluster: kube-apiserver %s, nodes: %s (test/chaos)\n", version.GitVersion, strings.Join(runtimes, "; "))
	os.Exit(m.Run())
}
