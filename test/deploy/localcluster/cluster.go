// Package localcluster runs what users apply, on one machine and without containers: a real
// kube-apiserver and etcd (envtest, built from source by hack/build-control-plane.sh) with RBAC
// and an audit log, the rendered manifests applied with server-side apply, and a small "kubelet"
// that runs each rendered Deployment's pods as local processes of the binaries the Dockerfile
// builds, with the manifests' command, args and environment, ServiceAccount-token kubeconfigs,
// volumes as folders and Services as loopback ports. What it has to translate (paths, ports,
// in-cluster addresses) is listed in Pod.Translations and in docs/development.md.
package localcluster

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
)

// FieldManager is the server-side apply field manager of what the tests apply (as kubectl's).
const FieldManager = "kubectl"

// auditPolicy records every request of a ServiceAccount (the operator's and the service's) so that
// a refusal by RBAC is found whatever the binaries log.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  userGroups: ["system:serviceaccounts"]
- level: None
`

// Cluster is a control plane plus the local kubelet.
type Cluster struct {
	// Config and Client are the cluster admin's.
	Config    *rest.Config
	Client    client.Client
	Clientset kubernetes.Interface
	Scheme    *runtime.Scheme
	// Dir holds the audit log, the pods' folders, volumes and logs.
	Dir string
	// Images maps an image repository (without tag) to what runs for it here.
	Images map[string]Image

	env       *envtest.Environment
	auditPath string

	mu    sync.Mutex
	ports map[string]int // "namespace/deployment/replica/containerPort" -> loopback port
	pods  []*Pod
	seq   map[string]int // pods started per deployment (pod names)
}

// Options configure Start.
type Options struct {
	// Assets is the folder with kube-apiserver and etcd (KUBEBUILDER_ASSETS).
	Assets string
	// Dir is the cluster's folder (created); it must be traversable by the pods' users.
	Dir string
}

// Start runs the control plane (RBAC on, audit log on, no CRDs: they come from the render).
func Start(o Options) (*Cluster, error) {
	if o.Assets == "" {
		return nil, errors.New("localcluster: KUBEBUILDER_ASSETS is not set: run `make test` (hack/build-control-plane.sh builds kube-apiserver and etcd)")
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("localcluster: %w", err)
	}
	// The pods run as their own users (securityContext): everything below Dir must be reachable.
	if err := os.Chmod(o.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("localcluster: %w", err)
	}
	policy := filepath.Join(o.Dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o644); err != nil {
		return nil, fmt.Errorf("localcluster: %w", err)
	}
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(a2av1.AddToScheme(scheme))
	utilruntime.Must(apiextensionsv1.AddToScheme(scheme))
	c := &Cluster{Dir: o.Dir, Scheme: scheme, auditPath: filepath.Join(o.Dir, "audit.log"),
		ports: map[string]int{}, seq: map[string]int{}, Images: map[string]Image{}}
	c.env = &envtest.Environment{Scheme: scheme, BinaryAssetsDirectory: o.Assets}
	api := c.env.ControlPlane.GetAPIServer()
	api.Configure().Set("audit-policy-file", policy).Set("audit-log-path", c.auditPath).
		Set("audit-log-format", "json").Set("audit-log-mode", "blocking")
	cfg, err := c.env.Start()
	if err != nil {
		return nil, fmt.Errorf("localcluster: start control plane: %w", err)
	}
	c.Config = cfg
	if c.Client, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		_ = c.env.Stop()
		return nil, fmt.Errorf("localcluster: client: %w", err)
	}
	if c.Clientset, err = kubernetes.NewForConfig(cfg); err != nil {
		_ = c.env.Stop()
		return nil, fmt.Errorf("localcluster: clientset: %w", err)
	}
	v, err := c.Clientset.Discovery().ServerVersion()
	if err != nil {
		_ = c.env.Stop()
		return nil, fmt.Errorf("localcluster: server version: %w", err)
	}
	fmt.Printf("localcluster: kube-apiserver %s (%s) from %s, RBAC and audit log on\n", v.GitVersion, v.Platform, o.Assets)
	return c, nil
}

// Stop stops every pod and the control plane.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	pods := c.pods
	c.pods = nil
	c.mu.Unlock()
	for _, p := range pods {
		p.Delete()
	}
	return c.env.Stop()
}

// Apply applies objs with server-side apply as FieldManager, CRDs first (waiting until they are
// established), in the order given otherwise; objects without a namespace that need one go to
// defaultNS.
func (c *Cluster) Apply(ctx context.Context, objs []*unstructured.Unstructured, defaultNS string) error {
	var crds, rest []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "CustomResourceDefinition" {
			crds = append(crds, o)
		} else {
			rest = append(rest, o)
		}
	}
	for _, o := range crds {
		if err := c.applyOne(ctx, o, ""); err != nil {
			return err
		}
	}
	for _, o := range crds {
		if err := c.waitEstablished(ctx, o.GetName()); err != nil {
			return err
		}
	}
	// Namespaces before what lives in them.
	sort.SliceStable(rest, func(i, j int) bool { return rest[i].GetKind() == "Namespace" && rest[j].GetKind() != "Namespace" })
	for _, o := range rest {
		if err := c.applyOne(ctx, o, defaultNS); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) applyOne(ctx context.Context, o *unstructured.Unstructured, defaultNS string) error {
	o = o.DeepCopy()
	if o.GetNamespace() == "" && defaultNS != "" {
		namespaced, err := c.Client.IsObjectNamespaced(o)
		if err != nil {
			return fmt.Errorf("localcluster: apply %s/%s: %w", o.GetKind(), o.GetName(), err)
		}
		if namespaced {
			o.SetNamespace(defaultNS)
		}
	}
	if err := c.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(o), client.FieldOwner(FieldManager), client.ForceOwnership); err != nil {
		return fmt.Errorf("localcluster: apply %s %s/%s: %w", o.GetKind(), o.GetNamespace(), o.GetName(), err)
	}
	return nil
}

func (c *Cluster) waitEstablished(ctx context.Context, name string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		err := c.Client.Get(ctx, client.ObjectKey{Name: name}, crd)
		if err == nil {
			for _, cond := range crd.Status.Conditions {
				if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
					// The RESTMapper of Client learns the new kinds on its next miss.
					return nil
				}
			}
		} else if !apierrors.IsNotFound(err) {
			return fmt.Errorf("localcluster: get CRD %s: %w", name, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("localcluster: CRD %s not established after 30s", name)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// AuditEvent is one request of a ServiceAccount that the API server refused.
type AuditEvent struct {
	User      string `json:"user"`
	Verb      string `json:"verb"`
	Resource  string `json:"resource"`
	Namespace string `json:"namespace"`
	Code      int    `json:"code"`
}

func (e AuditEvent) String() string {
	return fmt.Sprintf("%s %s %s (namespace %q): HTTP %d", e.User, e.Verb, e.Resource, e.Namespace, e.Code)
}

// Forbidden lists every request of a ServiceAccount that RBAC refused (HTTP 403), and how many
// ServiceAccount requests the audit log holds in all (evidence that it records).
func (c *Cluster) Forbidden() ([]AuditEvent, int, error) {
	f, err := os.Open(c.auditPath)
	if err != nil {
		return nil, 0, fmt.Errorf("localcluster: audit log: %w", err)
	}
	defer f.Close()
	var out []AuditEvent
	total := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var ev struct {
			Verb string `json:"verb"`
			User struct {
				Username string `json:"username"`
			} `json:"user"`
			ObjectRef *struct {
				Resource, Namespace, APIGroup, Subresource string
			} `json:"objectRef"`
			RequestURI     string `json:"requestURI"`
			ResponseStatus *struct {
				Code int `json:"code"`
			} `json:"responseStatus"`
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			continue
		}
		if !strings.HasPrefix(ev.User.Username, "system:serviceaccount:") {
			continue
		}
		total++
		if ev.ResponseStatus == nil || ev.ResponseStatus.Code != 403 {
			continue
		}
		e := AuditEvent{User: ev.User.Username, Verb: ev.Verb, Resource: ev.RequestURI, Code: ev.ResponseStatus.Code}
		if r := ev.ObjectRef; r != nil {
			e.Resource = strings.TrimPrefix(r.APIGroup+"/"+r.Resource, "/")
			if r.Subresource != "" {
				e.Resource += "/" + r.Subresource
			}
			e.Namespace = r.Namespace
		}
		out = append(out, e)
	}
	return out, total, sc.Err()
}
