package localcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Image is what runs here for a container image.
type Image struct {
	// Entrypoint is the image's ENTRYPOINT, as local paths (used when a container sets no command).
	Entrypoint []string
	// User is the image's USER (uid), used when the pod sets no runAsUser.
	User int64
	// Files maps paths inside the image to the local files that stand in for them (e.g. the
	// dynsec plugin, which Debian installs elsewhere than the eclipse-mosquitto image).
	Files map[string]string
	// ConfigRewrites translates container-only settings in the text files the pod reads from
	// ConfigMaps (e.g. a listener port) given the pod's port mapping.
	ConfigRewrites func(text string, port func(containerPort int) int) string
	// ArgRewrites translates container-only settings in the command line (e.g. a port given as a
	// separate argument) given the pod's port mapping.
	ArgRewrites func(argv []string, port func(containerPort int) int) []string
}

// Pod is one replica of a Deployment running as local processes.
type Pod struct {
	Name, Namespace, Deployment string
	Replica                     int
	// Translations lists what the kubelet changed to run the pod here (for the test log).
	Translations []string

	c       *Cluster
	spec    corev1.PodSpec
	dir     string
	mu      sync.Mutex
	running map[string]*Proc // container name -> current process
	deleted bool
	// restarts counts container restarts that nobody asked for (a crash, an exit).
	restarts map[string]int
	// kubeconfig of the pod's ServiceAccount (TokenRequest).
	kubeconfig string
	// terminations are how the containers ended when the pod was deleted.
	terminations []Termination
}

// Termination is how a container of a deleted pod ended: SIGTERM, then SIGKILL when it was still
// running after the pod's termination grace period.
type Termination struct {
	Container string
	// Took is the time from SIGTERM to the exit.
	Took time.Duration
	// Killed: the grace period ran out and the container was killed.
	Killed bool
	// ExitCode of the container (-1 when killed by a signal).
	ExitCode int
}

// containerStartTimeout bounds how long a container waits for what it needs at start (a Secret
// that another component writes), as the kubelet keeps retrying CreateContainerConfigError.
const containerStartTimeout = 3 * time.Minute

// StartPod runs replica of Deployment namespace/name: init containers to completion, then the
// containers, each restarted when it exits (restartPolicy Always). It returns once the containers
// have been started; use WaitReady for the readiness probes.
func (c *Cluster) StartPod(ctx context.Context, namespace, name string, replica int) (*Pod, error) {
	d := &appsv1.Deployment{}
	if err := c.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, d); err != nil {
		return nil, fmt.Errorf("localcluster: get deployment %s/%s: %w", namespace, name, err)
	}
	c.mu.Lock()
	c.seq[namespace+"/"+name]++
	n := c.seq[namespace+"/"+name]
	c.mu.Unlock()
	p := &Pod{
		Name: fmt.Sprintf("%s-%d-%d", name, n, replica), Namespace: namespace, Deployment: name, Replica: replica,
		c: c, spec: *d.Spec.Template.Spec.DeepCopy(), running: map[string]*Proc{}, restarts: map[string]int{},
	}
	p.dir = filepath.Join(c.Dir, "pods", p.Name)
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		return nil, fmt.Errorf("localcluster: %w", err)
	}
	c.mu.Lock()
	c.pods = append(c.pods, p)
	c.mu.Unlock()
	if err := p.setUp(ctx); err != nil {
		return nil, err
	}
	for _, ic := range p.spec.InitContainers {
		if err := p.runToCompletion(ctx, ic); err != nil {
			return nil, err
		}
	}
	for _, ct := range p.spec.Containers {
		if err := p.startContainer(ctx, ct); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// setUp makes the pod's ServiceAccount kubeconfig and its emptyDir and claim folders.
func (p *Pod) setUp(ctx context.Context) error {
	sa := p.spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	if !ptr.Deref(p.spec.AutomountServiceAccountToken, true) {
		p.note("no ServiceAccount token (automountServiceAccountToken: false)")
		return nil
	}
	if sa == "default" {
		// The ServiceAccount controller (not running here) gives every namespace a "default".
		err := p.c.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: sa}})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("localcluster: default serviceaccount: %w", err)
		}
	}
	return p.writeKubeconfig(ctx, sa)
}

func (p *Pod) writeKubeconfig(ctx context.Context, sa string) error {
	tr, err := p.c.Clientset.CoreV1().ServiceAccounts(p.Namespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("localcluster: token for serviceaccount %s/%s (pod %s): %w", p.Namespace, sa, p.Name, err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["in-cluster"] = &clientcmdapi.Cluster{Server: p.c.Config.Host, CertificateAuthorityData: p.c.Config.CAData}
	cfg.AuthInfos[sa] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	cfg.Contexts["in-cluster"] = &clientcmdapi.Context{Cluster: "in-cluster", AuthInfo: sa, Namespace: p.Namespace}
	cfg.CurrentContext = "in-cluster"
	p.kubeconfig = filepath.Join(p.dir, "serviceaccount.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, p.kubeconfig); err != nil {
		return fmt.Errorf("localcluster: write kubeconfig: %w", err)
	}
	p.note("ServiceAccount %s: a TokenRequest token in a kubeconfig (KUBECONFIG) instead of the in-cluster mount", sa)
	return nil
}

func (p *Pod) note(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, t := range p.Translations {
		if t == msg {
			return
		}
	}
	p.Translations = append(p.Translations, msg)
}

// uid is who a container runs as: its securityContext, the pod's, else the image's USER.
func (p *Pod) uid(ct corev1.Container, img Image) (uid, gid int64) {
	uid, gid = img.User, img.User
	if sc := p.spec.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			uid, gid = *sc.RunAsUser, *sc.RunAsUser
		}
		if sc.RunAsGroup != nil {
			gid = *sc.RunAsGroup
		}
	}
	if sc := ct.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			uid = *sc.RunAsUser
		}
		if sc.RunAsGroup != nil {
			gid = *sc.RunAsGroup
		}
	}
	return uid, gid
}

func (p *Pod) fsGroup() (int64, bool) {
	if sc := p.spec.SecurityContext; sc != nil && sc.FSGroup != nil {
		return *sc.FSGroup, true
	}
	return 0, false
}

// image finds what runs for ct.Image.
func (p *Pod) image(ct corev1.Container) (Image, error) {
	repo := ct.Image
	if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
		repo = repo[:i]
	}
	img, ok := p.c.Images[repo]
	if !ok {
		return Image{}, fmt.Errorf("localcluster: container %s of %s: no local stand-in for image %q (known: %v)", ct.Name, p.Name, ct.Image, keys(p.c.Images))
	}
	return img, nil
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// mounts materialises ct's volumes and returns mountPath -> local folder, plus the image's files.
func (p *Pod) mounts(ctx context.Context, ct corev1.Container, img Image, uid int64) (map[string]string, error) {
	m := map[string]string{}
	for from, to := range img.Files {
		m[from] = to
	}
	gid, hasFSGroup := p.fsGroup()
	for _, vm := range ct.VolumeMounts {
		var vol *corev1.Volume
		for i := range p.spec.Volumes {
			if p.spec.Volumes[i].Name == vm.Name {
				vol = &p.spec.Volumes[i]
			}
		}
		if vol == nil {
			return nil, fmt.Errorf("localcluster: %s: volumeMount %s names no volume", p.Name, vm.Name)
		}
		var dir string
		switch {
		case vol.EmptyDir != nil:
			dir = filepath.Join(p.dir, "volumes", vol.Name)
		case vol.PersistentVolumeClaim != nil:
			claim := vol.PersistentVolumeClaim.ClaimName
			if err := p.c.Client.Get(ctx, client.ObjectKey{Namespace: p.Namespace, Name: claim}, &corev1.PersistentVolumeClaim{}); err != nil {
				return nil, fmt.Errorf("localcluster: %s: claim %s: %w", p.Name, claim, err)
			}
			dir = filepath.Join(p.c.Dir, "claims", p.Namespace, claim)
		case vol.ConfigMap != nil, vol.Secret != nil:
			dir = filepath.Join(p.dir, "volumes", vol.Name)
		default:
			return nil, fmt.Errorf("localcluster: %s: volume %s: kind not supported here", p.Name, vol.Name)
		}
		if err := os.MkdirAll(dir, 0o775); err != nil {
			return nil, fmt.Errorf("localcluster: %w", err)
		}
		if vol.EmptyDir != nil || vol.PersistentVolumeClaim != nil {
			// fsGroup: the volume belongs to the pod's group and is group-writable.
			owner := uid
			group := uid
			if hasFSGroup {
				group = gid
			}
			if os.Geteuid() == 0 {
				if err := os.Chown(dir, int(owner), int(group)); err != nil {
					return nil, fmt.Errorf("localcluster: chown volume: %w", err)
				}
			}
		}
		m[vm.MountPath] = dir
	}
	return m, nil
}

// fillConfigVolumes writes the ConfigMap and Secret volumes' files (read from the API, as the
// kubelet does at pod start), with ConfigMap text translated like the container's arguments.
func (p *Pod) fillConfigVolumes(ctx context.Context, ct corev1.Container, img Image, translate func(string) string) error {
	for _, vm := range ct.VolumeMounts {
		for _, vol := range p.spec.Volumes {
			if vol.Name != vm.Name {
				continue
			}
			dir := filepath.Join(p.dir, "volumes", vol.Name)
			var files map[string][]byte
			var items []corev1.KeyToPath
			switch {
			case vol.ConfigMap != nil:
				cm := &corev1.ConfigMap{}
				if err := p.c.Client.Get(ctx, client.ObjectKey{Namespace: p.Namespace, Name: vol.ConfigMap.Name}, cm); err != nil {
					return fmt.Errorf("localcluster: %s: configmap %s: %w", p.Name, vol.ConfigMap.Name, err)
				}
				files = map[string][]byte{}
				for k, v := range cm.Data {
					text := translate(v)
					if img.ConfigRewrites != nil {
						text = img.ConfigRewrites(text, func(cp int) int { return p.c.port(p, cp) })
					}
					if text != v {
						p.note("ConfigMap %s key %s: container paths and ports translated", vol.ConfigMap.Name, k)
					}
					files[k] = []byte(text)
				}
				items = vol.ConfigMap.Items
			case vol.Secret != nil:
				s, err := p.waitSecret(ctx, vol.Secret.SecretName, "")
				if err != nil {
					return err
				}
				files = s.Data
				items = vol.Secret.Items
			default:
				continue
			}
			if len(items) > 0 {
				picked := map[string][]byte{}
				for _, it := range items {
					picked[it.Path] = files[it.Key]
				}
				files = picked
			}
			for name, data := range files {
				path := filepath.Join(dir, name)
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					return err
				}
				if err := os.WriteFile(path, data, 0o644); err != nil {
					return fmt.Errorf("localcluster: write %s: %w", path, err)
				}
			}
		}
	}
	return nil
}

// waitSecret reads a Secret (and key), waiting for it like the kubelet retries a container whose
// environment or volume names a Secret that does not exist yet.
func (p *Pod) waitSecret(ctx context.Context, name, key string) (*corev1.Secret, error) {
	deadline := time.Now().Add(containerStartTimeout)
	for {
		s := &corev1.Secret{}
		err := p.c.Client.Get(ctx, client.ObjectKey{Namespace: p.Namespace, Name: name}, s)
		if err == nil && (key == "" || len(s.Data[key]) > 0) {
			return s, nil
		}
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("localcluster: %s: secret %s: %w", p.Name, name, err)
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("localcluster: %s: secret %s (key %q) still missing after %s (CreateContainerConfigError)", p.Name, name, key, containerStartTimeout)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// environment resolves ct's env like the kubelet: values with $(VAR) of earlier variables,
// Secret and ConfigMap keys, and the downward API fields used by the manifests.
func (p *Pod) environment(ctx context.Context, ct corev1.Container) (map[string]string, []string, error) {
	vars := map[string]string{}
	var order []string
	for _, e := range ct.Env {
		var v string
		switch {
		case e.ValueFrom == nil:
			v = expand(e.Value, vars)
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			s, err := p.waitSecret(ctx, ref.Name, ref.Key)
			if err != nil {
				return nil, nil, err
			}
			v = string(s.Data[ref.Key])
		case e.ValueFrom.ConfigMapKeyRef != nil:
			ref := e.ValueFrom.ConfigMapKeyRef
			cm := &corev1.ConfigMap{}
			if err := p.c.Client.Get(ctx, client.ObjectKey{Namespace: p.Namespace, Name: ref.Name}, cm); err != nil {
				return nil, nil, fmt.Errorf("localcluster: %s: configmap %s: %w", p.Name, ref.Name, err)
			}
			v = cm.Data[ref.Key]
		case e.ValueFrom.FieldRef != nil:
			switch e.ValueFrom.FieldRef.FieldPath {
			case "metadata.name":
				v = p.Name
			case "metadata.namespace":
				v = p.Namespace
			case "spec.serviceAccountName":
				v = p.spec.ServiceAccountName
			case "status.podIP", "status.hostIP":
				v = "127.0.0.1"
			default:
				return nil, nil, fmt.Errorf("localcluster: %s: fieldRef %s not supported here", p.Name, e.ValueFrom.FieldRef.FieldPath)
			}
		default:
			return nil, nil, fmt.Errorf("localcluster: %s: env %s: source not supported here", p.Name, e.Name)
		}
		if _, seen := vars[e.Name]; !seen {
			order = append(order, e.Name)
		}
		vars[e.Name] = v
	}
	return vars, order, nil
}

// expand is the kubelet's $(VAR) expansion: $(NAME) of a defined variable is replaced, $$ is a
// literal $, anything else stays as written.
func expand(s string, vars map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+2+end]
			if v, ok := vars[name]; ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

// serviceAddr matches an in-cluster Service address: NAME.NAMESPACE.svc[.cluster.local][:PORT].
var serviceAddr = regexp.MustCompile(`\b([a-z0-9]([-a-z0-9]*[a-z0-9])?)\.([a-z0-9]([-a-z0-9]*[a-z0-9])?)\.svc(\.cluster\.local)?(:([0-9]+))?\b`)

// listenAddr matches a listen address that binds every interface: ":8080" or "0.0.0.0:8080".
var listenAddr = regexp.MustCompile(`^(0\.0\.0\.0)?:([0-9]+)$`)

// translator maps the container's view onto this machine: mount paths and image files to folders
// and files here, Service addresses to the loopback ports of the pods behind them. An address that
// resolves to nothing is kept in err (a wiring mistake in the manifests).
type translator struct {
	ctx   context.Context
	pod   *Pod
	paths []string
	to    map[string]string
	err   error
}

func (p *Pod) translator(ctx context.Context, mounts map[string]string) *translator {
	paths := keys(mounts)
	// Longest first, so /mosquitto/data/x is not mapped by a /mosquitto mount.
	sort.Slice(paths, func(i, j int) bool { return len(paths[i]) > len(paths[j]) })
	return &translator{ctx: ctx, pod: p, paths: paths, to: mounts}
}

func (t *translator) do(s string) string {
	for _, from := range t.paths {
		s = strings.ReplaceAll(s, from, t.to[from])
	}
	return serviceAddr.ReplaceAllStringFunc(s, func(addr string) string {
		local, err := t.pod.c.resolveService(t.ctx, addr)
		if err != nil {
			t.err = errors.Join(t.err, err)
			return addr
		}
		t.pod.note("Service address %s -> %s", addr, local)
		return local
	})
}

// resolveService finds the pod port behind NAME.NAMESPACE.svc:PORT, as cluster DNS and kube-proxy
// would: the Service, its port's targetPort, a Deployment whose pods the selector matches, and
// the container port (by name or number).
func (c *Cluster) resolveService(ctx context.Context, addr string) (string, error) {
	m := serviceAddr.FindStringSubmatch(addr)
	name, ns, portStr := m[1], m[3], m[7]
	svc := &corev1.Service{}
	if err := c.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, svc); err != nil {
		return "", fmt.Errorf("localcluster: in-cluster address %s: service %s/%s: %w", addr, ns, name, err)
	}
	var sp *corev1.ServicePort
	for i := range svc.Spec.Ports {
		if portStr == "" || strconv.Itoa(int(svc.Spec.Ports[i].Port)) == portStr {
			sp = &svc.Spec.Ports[i]
			break
		}
	}
	if sp == nil {
		return "", fmt.Errorf("localcluster: in-cluster address %s: service %s/%s has no port %s", addr, ns, name, portStr)
	}
	var deploys appsv1.DeploymentList
	if err := c.Client.List(ctx, &deploys, client.InNamespace(ns)); err != nil {
		return "", fmt.Errorf("localcluster: list deployments: %w", err)
	}
	sel := labels.SelectorFromSet(svc.Spec.Selector)
	for _, d := range deploys.Items {
		if len(svc.Spec.Selector) == 0 || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			continue
		}
		for _, ct := range d.Spec.Template.Spec.Containers {
			for _, cp := range ct.Ports {
				if (sp.TargetPort.Type == intstr.String && cp.Name == sp.TargetPort.StrVal) ||
					(sp.TargetPort.Type == intstr.Int && cp.ContainerPort == sp.TargetPort.IntVal) {
					return fmt.Sprintf("127.0.0.1:%d", c.portFor(ns, d.Name, 0, int(cp.ContainerPort))), nil
				}
			}
		}
	}
	return "", fmt.Errorf("localcluster: in-cluster address %s: no pod of a Deployment in %s matches service %s (selector %v, targetPort %s)", addr, ns, name, svc.Spec.Selector, sp.TargetPort.String())
}

// port is the loopback port that stands for containerPort of p (stable across restarts of the pod).
func (c *Cluster) port(p *Pod, containerPort int) int {
	return c.portFor(p.Namespace, p.Deployment, p.Replica, containerPort)
}

func (c *Cluster) portFor(ns, deploy string, replica, containerPort int) int {
	key := fmt.Sprintf("%s/%s/%d/%d", ns, deploy, replica, containerPort)
	c.mu.Lock()
	defer c.mu.Unlock()
	if port, ok := c.ports[key]; ok {
		return port
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(fmt.Sprintf("localcluster: free port: %v", err))
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	c.ports[key] = port
	return port
}

// command resolves what ct runs: its command (or the image's entrypoint) and args, with $(VAR)
// expanded and container paths, Service addresses and listen addresses translated.
func (p *Pod) command(ct corev1.Container, img Image, vars map[string]string, translate func(string) string) ([]string, error) {
	var argv []string
	if len(ct.Command) > 0 {
		for _, a := range ct.Command {
			argv = append(argv, translate(expand(a, vars)))
		}
	} else {
		if len(img.Entrypoint) == 0 {
			return nil, fmt.Errorf("localcluster: %s: image %s has no entrypoint here", p.Name, ct.Image)
		}
		argv = append(argv, img.Entrypoint...)
	}
	for _, a := range ct.Args {
		a = translate(expand(a, vars))
		if flag, value, ok := strings.Cut(a, "="); ok && strings.HasPrefix(flag, "-") {
			if m := listenAddr.FindStringSubmatch(value); m != nil {
				cp, _ := strconv.Atoi(m[2])
				local := fmt.Sprintf("127.0.0.1:%d", p.c.port(p, cp))
				p.note("%s=%s -> %s", flag, value, local)
				a = flag + "=" + local
			}
		}
		argv = append(argv, a)
	}
	if img.ArgRewrites != nil {
		argv = img.ArgRewrites(argv, func(cp int) int { return p.c.port(p, cp) })
		p.note("command line translated for this machine: %v", argv[1:])
	}
	return argv, nil
}

// prepare resolves everything a container start needs.
func (p *Pod) prepare(ctx context.Context, ct corev1.Container) (argv, env []string, cred *syscall.Credential, err error) {
	img, err := p.image(ct)
	if err != nil {
		return nil, nil, nil, err
	}
	uid, gid := p.uid(ct, img)
	mounts, err := p.mounts(ctx, ct, img, uid)
	if err != nil {
		return nil, nil, nil, err
	}
	tr := p.translator(ctx, mounts)
	if err := p.fillConfigVolumes(ctx, ct, img, tr.do); err != nil {
		return nil, nil, nil, err
	}
	vars, order, err := p.environment(ctx, ct)
	if err != nil {
		return nil, nil, nil, err
	}
	if argv, err = p.command(ct, img, vars, tr.do); err != nil {
		return nil, nil, nil, err
	}
	// A container runtime always sets PATH, HOSTNAME and HOME (from the image's passwd, "/" when the
	// user has none); HOME here is a folder of the pod.
	home := filepath.Join(p.dir, "home")
	if err := os.MkdirAll(home, 0o755); err != nil {
		return nil, nil, nil, err
	}
	env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOSTNAME=" + p.Name, "HOME=" + home}
	p.note("HOSTNAME=%s, but os.Hostname() is this machine's (no UTS namespace): leader-election identities share its prefix", p.Name)
	if p.kubeconfig != "" {
		env = append(env, "KUBECONFIG="+p.kubeconfig)
	}
	for _, k := range order {
		env = append(env, k+"="+tr.do(vars[k]))
	}
	if tr.err != nil {
		return nil, nil, nil, fmt.Errorf("localcluster: %s container %s: %w", p.Name, ct.Name, tr.err)
	}
	if os.Geteuid() == 0 {
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if fsg, ok := p.fsGroup(); ok {
			cred.Groups = []uint32{uint32(fsg)}
		}
		if p.kubeconfig != "" {
			if err := os.Chown(p.kubeconfig, int(uid), int(gid)); err != nil {
				return nil, nil, nil, fmt.Errorf("localcluster: chown kubeconfig: %w", err)
			}
		}
		p.note("runs as uid %d gid %d (securityContext or the image's USER)", uid, gid)
	}
	return argv, env, cred, nil
}

func (p *Pod) runToCompletion(ctx context.Context, ct corev1.Container) error {
	argv, env, cred, err := p.prepare(ctx, ct)
	if err != nil {
		return err
	}
	proc, err := StartProcess(p.logPath(ct.Name), argv, env, cred)
	if err != nil {
		return fmt.Errorf("localcluster: %s init container %s: %w", p.Name, ct.Name, err)
	}
	select {
	case <-proc.Exited():
	case <-ctx.Done():
		proc.Kill()
		return ctx.Err()
	}
	if code := proc.ExitCode(); code != 0 {
		return fmt.Errorf("localcluster: %s init container %s exited %d:\n%s", p.Name, ct.Name, code, proc.Output())
	}
	return nil
}

func (p *Pod) logPath(container string) string {
	return filepath.Join(p.dir, container+".log")
}

// startContainer starts ct and restarts it whenever it exits, until the pod is deleted or the
// container is stopped on purpose.
func (p *Pod) startContainer(ctx context.Context, ct corev1.Container) error {
	argv, env, cred, err := p.prepare(ctx, ct)
	if err != nil {
		return err
	}
	proc, err := StartProcess(p.logPath(ct.Name), argv, env, cred)
	if err != nil {
		return fmt.Errorf("localcluster: %s container %s: %w", p.Name, ct.Name, err)
	}
	p.mu.Lock()
	p.running[ct.Name] = proc
	p.mu.Unlock()
	go p.superviseContainer(ct, proc)
	return nil
}

// superviseContainer is restartPolicy Always: a container that exits although nobody stopped it
// is started again after a back-off, and counted.
func (p *Pod) superviseContainer(ct corev1.Container, proc *Proc) {
	<-proc.Exited()
	p.mu.Lock()
	current := p.running[ct.Name] == proc
	deleted := p.deleted
	if current && !deleted && !proc.stopped.Load() {
		p.restarts[ct.Name]++
	}
	restart := current && !deleted && !proc.stopped.Load()
	n := p.restarts[ct.Name]
	p.mu.Unlock()
	if !restart {
		return
	}
	time.Sleep(min(time.Duration(n)*time.Second, 10*time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), containerStartTimeout)
	defer cancel()
	if err := p.startContainer(ctx, ct); err != nil {
		fmt.Fprintf(os.Stderr, "localcluster: restart %s/%s: %v\n", p.Name, ct.Name, err)
	}
}

// Proc returns the current process of container name (nil when none).
func (p *Pod) Proc(name string) *Proc {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.running[name]
}

// Restarts counts the container restarts nobody asked for (exits and crashes).
func (p *Pod) Restarts() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]int{}
	for k, v := range p.restarts {
		out[k] = v
	}
	return out
}

// KillContainer is kill -9 of a container; the kubelet starts it again in the same pod (same
// name, same emptyDir) at once, which is what a crash looks like.
func (p *Pod) KillContainer(ctx context.Context, name string) error {
	p.mu.Lock()
	proc := p.running[name]
	p.mu.Unlock()
	if proc == nil {
		return fmt.Errorf("localcluster: %s has no running container %s", p.Name, name)
	}
	proc.stopped.Store(true)
	proc.Kill()
	for _, ct := range p.spec.Containers {
		if ct.Name == name {
			return p.startContainer(ctx, ct)
		}
	}
	return fmt.Errorf("localcluster: %s has no container %s", p.Name, name)
}

// StopContainer stops a container for good (SIGTERM, then SIGKILL after the grace period) and does
// not restart it: the pod stays without it until StartContainer.
func (p *Pod) StopContainer(name string, sig syscall.Signal) {
	p.mu.Lock()
	proc := p.running[name]
	delete(p.running, name)
	p.mu.Unlock()
	if proc != nil {
		proc.stopped.Store(true)
		proc.Signal(sig, p.grace())
	}
}

// StartContainer starts a stopped container again (a new process, same pod).
func (p *Pod) StartContainer(ctx context.Context, name string) error {
	for _, ct := range p.spec.Containers {
		if ct.Name == name {
			return p.startContainer(ctx, ct)
		}
	}
	return fmt.Errorf("localcluster: %s has no container %s", p.Name, name)
}

func (p *Pod) grace() time.Duration {
	if g := p.spec.TerminationGracePeriodSeconds; g != nil {
		return time.Duration(*g) * time.Second
	}
	return 30 * time.Second
}

// Delete stops every container gracefully (SIGTERM, SIGKILL after the grace period); the pod's
// emptyDir volumes go with it, claims stay.
func (p *Pod) Delete() {
	p.mu.Lock()
	p.deleted = true
	procs := p.running
	p.running = map[string]*Proc{}
	p.mu.Unlock()
	var wg sync.WaitGroup
	for name, proc := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			proc.stopped.Store(true)
			start := time.Now()
			killed := proc.Signal(syscall.SIGTERM, p.grace())
			p.mu.Lock()
			p.terminations = append(p.terminations, Termination{Container: name, Took: time.Since(start), Killed: killed, ExitCode: proc.ExitCode()})
			p.mu.Unlock()
		}()
	}
	wg.Wait()
}

// Terminations are how the containers ended, once the pod was deleted (empty before).
func (p *Pod) Terminations() []Termination {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Termination(nil), p.terminations...)
}

// Port is the loopback port that stands for the pod's containerPort.
func (p *Pod) Port(containerPort int) int { return p.c.port(p, containerPort) }

// namedPort finds a container port by name or number.
func (p *Pod) namedPort(port intstr.IntOrString) (int, error) {
	if port.Type == intstr.Int {
		return p.Port(int(port.IntVal)), nil
	}
	for _, ct := range p.spec.Containers {
		for _, cp := range ct.Ports {
			if cp.Name == port.StrVal {
				return p.Port(int(cp.ContainerPort)), nil
			}
		}
	}
	return 0, fmt.Errorf("localcluster: %s has no port named %s", p.Name, port.StrVal)
}

// Probe runs a container's readiness (or liveness) probe once.
func (p *Pod) Probe(ctx context.Context, readiness bool) error {
	for _, ct := range p.spec.Containers {
		pr := ct.ReadinessProbe
		if !readiness {
			pr = ct.LivenessProbe
		}
		if pr == nil {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := p.probeOnce(pctx, pr)
		cancel()
		if err != nil {
			return fmt.Errorf("%s/%s: %w", p.Name, ct.Name, err)
		}
	}
	return nil
}

func (p *Pod) probeOnce(ctx context.Context, pr *corev1.Probe) error {
	switch {
	case pr.HTTPGet != nil:
		port, err := p.namedPort(pr.HTTPGet.Port)
		if err != nil {
			return err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d%s", port, pr.HTTPGet.Path), nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode >= 400 {
			body := make([]byte, 512)
			n, _ := resp.Body.Read(body)
			return fmt.Errorf("GET %s: %d %s", pr.HTTPGet.Path, resp.StatusCode, strings.TrimSpace(string(body[:n])))
		}
		return nil
	case pr.TCPSocket != nil:
		port, err := p.namedPort(pr.TCPSocket.Port)
		if err != nil {
			return err
		}
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			return err
		}
		return conn.Close()
	}
	return errors.New("probe kind not supported here")
}

// WaitReady polls the readiness probes until they pass or timeout.
func (p *Pod) WaitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := p.Probe(ctx, true)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("localcluster: %s not ready after %s: %w", p.Name, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Logs returns what the pod's containers wrote so far (every run, in order).
func (p *Pod) Logs() string {
	var b strings.Builder
	entries, _ := filepath.Glob(filepath.Join(p.dir, "*.log"))
	for _, e := range entries {
		data, _ := os.ReadFile(e)
		fmt.Fprintf(&b, "----- %s/%s\n%s", p.Name, filepath.Base(e), data)
	}
	return b.String()
}

// Pods lists every pod started so far.
func (c *Cluster) Pods() []*Pod {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*Pod(nil), c.pods...)
}

// LocalURL translates the in-cluster Service address in url (mqtt://NAME.NS.svc:PORT) to the
// loopback address of the pod behind it, for clients that run outside the "cluster" here.
func (c *Cluster) LocalURL(ctx context.Context, url string) (string, error) {
	var err error
	out := serviceAddr.ReplaceAllStringFunc(url, func(addr string) string {
		local, rerr := c.resolveService(ctx, addr)
		if rerr != nil {
			err = rerr
			return addr
		}
		return local
	})
	return out, err
}

// VolumeDir is the local folder of the pod's emptyDir (or ConfigMap/Secret) volume name.
func (p *Pod) VolumeDir(name string) string { return filepath.Join(p.dir, "volumes", name) }

// Spec is the pod's spec as it was started.
func (p *Pod) Spec() corev1.PodSpec { return p.spec }

// ClaimDir is the local folder that stands for PersistentVolumeClaim namespace/name.
func (c *Cluster) ClaimDir(namespace, name string) string {
	return filepath.Join(c.Dir, "claims", namespace, name)
}
