package deploy

import (
	"bytes"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/sluicehq/sluice/internal/proctest"
)

// kustomizeModule renders the manifests where kubectl is missing or
// bundles a kustomize older than v5 (Debian's kubernetes-client 1.20 has
// v2, which lacks much of what the manifests use). The version is the
// one kubectl 1.32 bundles.
const kustomizeModule = "sigs.k8s.io/kustomize/kustomize/v5@v5.5.0"

// kustomize renders the kustomization in dir: with `kubectl kustomize` when
// kubectl bundles kustomize v5 or later, else with kustomizeModule through
// `go run` (the Go module proxy). SLUICE_TEST_KUSTOMIZE=go forces the
// latter, to test it where kubectl exists.
func kustomize(t *testing.T, dir string) []byte {
	t.Helper()
	var cmd *exec.Cmd
	if kubectl, err := exec.LookPath("kubectl"); err == nil && os.Getenv("SLUICE_TEST_KUSTOMIZE") != "go" && kubectlKustomizeV5(kubectl) {
		cmd = exec.Command(kubectl, "kustomize", dir)
	} else {
		cmd = exec.Command("go", "run", kustomizeModule, "build", dir)
		cmd.Dir = t.TempDir() // outside sluice's module
		t.Logf("rendering with go run %s", kustomizeModule)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, stderr.String())
	}
	return out
}

// kubectlKustomizeV5 reports whether kubectl bundles kustomize v5 or later.
func kubectlKustomizeV5(kubectl string) bool {
	out, err := exec.Command(kubectl, "version", "--client", "--output=json").Output()
	if err != nil {
		return false
	}
	var v struct {
		KustomizeVersion string `json:"kustomizeVersion"`
	}
	if json.Unmarshal(out, &v) != nil {
		return false
	}
	major, _, _ := strings.Cut(strings.TrimPrefix(v.KustomizeVersion, "v"), ".")
	n, err := strconv.Atoi(major)
	return err == nil && n >= 5
}

// k8sObject is one rendered object, with the fields the checks read.
type k8sObject struct {
	APIVersion string `json:"apiVersion"`
	Kind       string
	Metadata   struct {
		Name      string
		Namespace string
		Labels    map[string]string
	}
	Data                         map[string]string
	AutomountServiceAccountToken *bool
	Spec                         json.RawMessage
}

type labelSelector struct {
	MatchLabels map[string]string
}

type podTemplate struct {
	Metadata struct{ Labels map[string]string }
	Spec     podSpec
}

type podSpec struct {
	ServiceAccountName            string
	AutomountServiceAccountToken  *bool
	TerminationGracePeriodSeconds *int
	RestartPolicy                 string
	SecurityContext               struct {
		RunAsNonRoot   *bool
		RunAsUser      *int
		SeccompProfile *struct{ Type string }
	}
	Containers []container
	Volumes    []struct {
		Name      string
		ConfigMap *struct{ Name string }
	}
}

type container struct {
	Name, Image string
	Args        []string
	Command     []string
	Ports       []struct {
		Name          string
		ContainerPort int
	}
	Env     []envVar
	EnvFrom []struct {
		ConfigMapRef *struct{ Name string }
		SecretRef    *struct{ Name string }
	}
	ReadinessProbe, LivenessProbe, StartupProbe *probe
	Lifecycle                                   *struct {
		PreStop *struct {
			Sleep *struct{ Seconds int }
		}
	}
	Resources struct {
		Requests, Limits map[string]string
	}
	SecurityContext *struct {
		RunAsNonRoot             *bool
		AllowPrivilegeEscalation *bool
		Privileged               *bool
		ReadOnlyRootFilesystem   *bool
		Capabilities             *struct{ Drop, Add []string }
	}
	VolumeMounts []struct {
		Name, MountPath string
		ReadOnly        bool
	}
}

type envVar struct {
	Name, Value string
	ValueFrom   *struct {
		SecretKeyRef     *struct{ Name, Key string }
		ConfigMapKeyRef  *struct{ Name, Key string }
		ResourceFieldRef *struct{ Resource string }
	}
}

type probe struct {
	HTTPGet *struct {
		Path string
		Port any // a number or a port's name
	}
}

// secretSettings are the settings that must come from a Secret, never from
// a manifest.
var secretSettings = []string{"SLUICE_HASH_KEY", "SLUICE_ADMIN_TOKEN", "SLUICE_DATABASE_URL", "DATABASE_URL"}

// manifests are the objects of one rendering, by kind and name.
type manifests map[string]k8sObject

func (m manifests) get(t *testing.T, kind, name string) k8sObject {
	t.Helper()
	o, ok := m[kind+"/"+name]
	if !ok {
		t.Fatalf("no %s %q rendered", kind, name)
	}
	return o
}

// configMap returns the ConfigMap kustomize generated from name (its name
// with a content hash appended).
func (m manifests) configMap(t *testing.T, generated string) k8sObject {
	t.Helper()
	for _, o := range m {
		if o.Kind == "ConfigMap" && o.Metadata.Name == generated {
			return o
		}
	}
	t.Fatalf("no ConfigMap %q rendered", generated)
	return k8sObject{}
}

// decodeManifests splits kustomize's output into its objects.
func decodeManifests(t *testing.T, out []byte) manifests {
	t.Helper()
	m := manifests{}
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(out), -1) {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		var o k8sObject
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatalf("rendered object: %v\n%s", err, doc)
		}
		key := o.Kind + "/" + o.Metadata.Name
		if _, dup := m[key]; dup {
			t.Fatalf("%s rendered twice", key)
		}
		m[key] = o
	}
	return m
}

func spec[T any](t *testing.T, o k8sObject) T {
	t.Helper()
	var s T
	if err := json.Unmarshal(o.Spec, &s); err != nil {
		t.Fatalf("%s %s: %v", o.Kind, o.Metadata.Name, err)
	}
	return s
}

// TestKubernetes renders the base and the example overlay with kustomize
// and checks every property a production deployment relies on.
func TestKubernetes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		dir       string
		namespace string
		replicas  int
		image     string
	}{
		{"kubernetes", "", 2, "sluice"},
		{"kubernetes/overlays/example", "sluice", 3, "registry.example.com/sluice:1.0.0"},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			m := decodeManifests(t, kustomize(t, filepath.Join(root, "deploy", tc.dir)))
			for _, o := range m {
				if o.Kind == "Secret" {
					t.Errorf("Secret %s is rendered: secrets are created in the cluster, never committed", o.Metadata.Name)
				}
				if o.Kind != "Namespace" && o.Metadata.Namespace != tc.namespace {
					t.Errorf("%s %s in namespace %q, want %q", o.Kind, o.Metadata.Name, o.Metadata.Namespace, tc.namespace)
				}
			}
			checkKubernetes(t, m, tc.replicas, tc.image)
		})
	}
}

func checkKubernetes(t *testing.T, m manifests, replicas int, image string) {
	dep := spec[struct {
		Replicas *int
		Selector labelSelector
		Template podTemplate
	}](t, m.get(t, "Deployment", "sluice"))
	pod := dep.Template.Spec
	podLabels := dep.Template.Metadata.Labels
	if dep.Replicas == nil || *dep.Replicas != replicas {
		t.Errorf("Deployment replicas %v, want %d", dep.Replicas, replicas)
	}
	if len(dep.Selector.MatchLabels) == 0 || !selects(dep.Selector.MatchLabels, podLabels) {
		t.Errorf("Deployment selector %v does not select its pods %v", dep.Selector.MatchLabels, podLabels)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("Deployment has %d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	if c.Image != image {
		t.Errorf("image %q, want %q", c.Image, image)
	}
	ports := map[string]int{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["http"] != 8080 || ports["admin"] != 9090 {
		t.Errorf("container ports %v, want http 8080 and admin 9090", ports)
	}
	env := literalEnv(c)
	if port := listenPort(t, env["SLUICE_LISTEN"]); port != ports["http"] {
		t.Errorf("SLUICE_LISTEN %q is not the http port", env["SLUICE_LISTEN"])
	}
	if host, port, _ := net.SplitHostPort(env["SLUICE_ADMIN_LISTEN"]); (host != "0.0.0.0" && host != "") || listenPort(t, env["SLUICE_ADMIN_LISTEN"]) != ports["admin"] {
		t.Errorf("SLUICE_ADMIN_LISTEN %q: want all interfaces on the admin port (%s), for probes and Prometheus", env["SLUICE_ADMIN_LISTEN"], port)
	}
	if env["SLUICE_AUTO_MIGRATE"] != "false" {
		t.Errorf("SLUICE_AUTO_MIGRATE %q: the migration Job migrates, the gateway's role cannot", env["SLUICE_AUTO_MIGRATE"])
	}

	// Probes on the admin port: readiness /readyz, liveness /healthz.
	for _, p := range []struct {
		name  string
		probe *probe
		path  string
	}{{"readiness", c.ReadinessProbe, "/readyz"}, {"liveness", c.LivenessProbe, "/healthz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("no HTTP %s probe", p.name)
			continue
		}
		if p.probe.HTTPGet.Path != p.path || resolvePort(p.probe.HTTPGet.Port, ports) != ports["admin"] {
			t.Errorf("%s probe GET %s on port %v, want %s on the admin port", p.name, p.probe.HTTPGet.Path, p.probe.HTTPGet.Port, p.path)
		}
	}

	// Longer than the drain, and than any preStop pause before it.
	grace := 30 // Kubernetes' default
	if pod.TerminationGracePeriodSeconds != nil {
		grace = *pod.TerminationGracePeriodSeconds
	}
	preStop := 0
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
		preStop = c.Lifecycle.PreStop.Sleep.Seconds
	}
	if grace <= preStop+int(drain.Seconds()) {
		t.Errorf("terminationGracePeriodSeconds %d: want more than the preStop's %d s plus the %s drain", grace, preStop, drain)
	}
	for _, r := range []string{"cpu", "memory"} {
		if c.Resources.Requests[r] == "" || c.Resources.Limits[r] == "" {
			t.Errorf("resources %+v: want requests and limits of %s", c.Resources, r)
		}
	}
	checkHardened(t, "Deployment", pod, c)

	// The rules from the ConfigMap, as a file.
	rulesFile := env["SLUICE_RULES_FILE"]
	var rulesCM, rulesKey string
	for _, vm := range c.VolumeMounts {
		if rel, ok := strings.CutPrefix(rulesFile, strings.TrimSuffix(vm.MountPath, "/")+"/"); ok && vm.ReadOnly {
			for _, v := range pod.Volumes {
				if v.Name == vm.Name && v.ConfigMap != nil {
					rulesCM, rulesKey = v.ConfigMap.Name, rel
				}
			}
		}
	}
	if rulesCM == "" {
		t.Fatalf("SLUICE_RULES_FILE %q is not in a read-only ConfigMap volume", rulesFile)
	}
	rules, ok := m.configMap(t, rulesCM).Data[rulesKey]
	if !ok {
		t.Fatalf("ConfigMap %s has no %s", rulesCM, rulesKey)
	}

	// The secrets from a Secret, never in a manifest.
	fromSecret := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			fromSecret[e.Name] = e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
		}
	}
	for _, k := range []string{"SLUICE_HASH_KEY", "SLUICE_ADMIN_TOKEN", "SLUICE_DATABASE_URL"} {
		if fromSecret[k] == "" {
			t.Errorf("%s does not come from a Secret", k)
		}
	}
	checkSecretsDocumented(t, fromSecret)
	var configEnv map[string]string
	for _, ef := range c.EnvFrom {
		if ef.ConfigMapRef != nil {
			configEnv = m.configMap(t, ef.ConfigMapRef.Name).Data
		}
	}
	for _, k := range secretSettings {
		if _, ok := env[k]; ok {
			t.Errorf("%s has a literal value in the Deployment", k)
		}
		if _, ok := configEnv[k]; ok {
			t.Errorf("%s is in a ConfigMap", k)
		}
	}

	// The pod's whole configuration is one sluice accepts.
	checkConfig(t, rules, configEnv, env)

	// Service, PodDisruptionBudget, HorizontalPodAutoscaler.
	for _, name := range []string{"sluice", "sluice-admin"} {
		svc := spec[struct {
			Selector map[string]string
			Ports    []struct {
				Name       string
				TargetPort any `json:"targetPort"`
			}
		}](t, m.get(t, "Service", name))
		if len(svc.Selector) == 0 || !selects(svc.Selector, podLabels) {
			t.Errorf("Service %s selects %v, not the pods %v", name, svc.Selector, podLabels)
		}
		for _, p := range svc.Ports {
			if resolvePort(p.TargetPort, ports) == 0 {
				t.Errorf("Service %s port %s targets %v, which the container does not expose", name, p.Name, p.TargetPort)
			}
		}
	}
	pdb := spec[struct {
		Selector       labelSelector
		MaxUnavailable any `json:"maxUnavailable"`
		MinAvailable   any `json:"minAvailable"`
	}](t, m.get(t, "PodDisruptionBudget", "sluice"))
	if !selects(pdb.Selector.MatchLabels, podLabels) || len(pdb.Selector.MatchLabels) == 0 {
		t.Errorf("PodDisruptionBudget selects %v, not the pods %v", pdb.Selector.MatchLabels, podLabels)
	}
	if pdb.MaxUnavailable != float64(1) && pdb.MinAvailable != float64(1) {
		t.Errorf("PodDisruptionBudget maxUnavailable %v, minAvailable %v: want one pod at a time", pdb.MaxUnavailable, pdb.MinAvailable)
	}
	hpa := spec[struct {
		ScaleTargetRef struct{ APIVersion, Kind, Name string }
		MinReplicas    *int
		MaxReplicas    int
		Metrics        []any
	}](t, m.get(t, "HorizontalPodAutoscaler", "sluice"))
	if hpa.ScaleTargetRef.Kind != "Deployment" || hpa.ScaleTargetRef.Name != "sluice" {
		t.Errorf("HorizontalPodAutoscaler scales %+v", hpa.ScaleTargetRef)
	}
	minReplicas := 1 // Kubernetes' default
	if hpa.MinReplicas != nil {
		minReplicas = *hpa.MinReplicas
	}
	if minReplicas != replicas || hpa.MaxReplicas <= minReplicas || len(hpa.Metrics) == 0 {
		t.Errorf("HorizontalPodAutoscaler min %d max %d metrics %d: want min %d (the Deployment's), a higher max, a metric",
			minReplicas, hpa.MaxReplicas, len(hpa.Metrics), replicas)
	}

	// The migration Job: sluice migrate with the owner's URL.
	job := spec[struct {
		BackoffLimit *int
		Template     podTemplate
	}](t, m.get(t, "Job", "sluice-migrate"))
	if len(job.Template.Spec.Containers) != 1 {
		t.Fatalf("migration Job has %d containers", len(job.Template.Spec.Containers))
	}
	jc := job.Template.Spec.Containers[0]
	if jc.Image != image || !slices.Equal(append(slices.Clone(jc.Command), jc.Args...), []string{"migrate"}) {
		t.Errorf("migration Job runs %q %q %q, want %s migrate", jc.Image, jc.Command, jc.Args, image)
	}
	if r := job.Template.Spec.RestartPolicy; r != "OnFailure" && r != "Never" {
		t.Errorf("migration Job restartPolicy %q", r)
	}
	var jobURL, jobSchema string
	for _, e := range jc.Env {
		switch {
		case e.Name == "SLUICE_DATABASE_URL" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			jobURL = e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
		case e.Name == "SLUICE_DB_SCHEMA" && e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil:
			jobSchema = m.configMap(t, e.ValueFrom.ConfigMapKeyRef.Name).Data[e.ValueFrom.ConfigMapKeyRef.Key]
		case slices.Contains(secretSettings, e.Name):
			t.Errorf("migration Job: %s not from a Secret", e.Name)
		}
	}
	checkSecretsDocumented(t, map[string]string{"migration Job's SLUICE_DATABASE_URL": jobURL})
	if jobURL == "" || jobURL == fromSecret["SLUICE_DATABASE_URL"] {
		t.Errorf("migration Job's database URL %q: want the owner role's, from a Secret of its own (the gateway's is %q)", jobURL, fromSecret["SLUICE_DATABASE_URL"])
	}
	if jobSchema == "" || jobSchema != configEnv["SLUICE_DB_SCHEMA"] {
		t.Errorf("migration Job migrates schema %q, the gateway uses %q", jobSchema, configEnv["SLUICE_DB_SCHEMA"])
	}
	checkHardened(t, "Job", job.Template.Spec, jc)

	checkNetworkPolicy(t, m, podLabels, ports)
}

// checkHardened checks a pod's and its container's security settings.
func checkHardened(t *testing.T, what string, pod podSpec, c container) {
	t.Helper()
	sc := c.SecurityContext
	switch {
	case pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot:
		t.Errorf("%s: pod runAsNonRoot is not true", what)
	case pod.SecurityContext.RunAsUser == nil || *pod.SecurityContext.RunAsUser == 0:
		t.Errorf("%s: pod runAsUser %v", what, pod.SecurityContext.RunAsUser)
	case pod.SecurityContext.SeccompProfile == nil || pod.SecurityContext.SeccompProfile.Type != "RuntimeDefault":
		t.Errorf("%s: no RuntimeDefault seccomp profile", what)
	case pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken:
		t.Errorf("%s: a service account token is mounted", what)
	case sc == nil:
		t.Errorf("%s: no container securityContext", what)
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Errorf("%s: root file system not read-only", what)
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Errorf("%s: privilege escalation allowed", what)
	case sc.Privileged != nil && *sc.Privileged:
		t.Errorf("%s: privileged", what)
	case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []string{"ALL"}) || len(sc.Capabilities.Add) > 0:
		t.Errorf("%s: capabilities %+v, want all dropped and none added", what, sc.Capabilities)
	}
}

// checkNetworkPolicy: the public port from anywhere, the admin port only
// from the monitoring namespace, and nothing else.
func checkNetworkPolicy(t *testing.T, m manifests, podLabels map[string]string, ports map[string]int) {
	t.Helper()
	np := spec[struct {
		PodSelector labelSelector
		PolicyTypes []string
		Ingress     []struct {
			From []struct {
				NamespaceSelector *labelSelector
				PodSelector       *labelSelector
				IPBlock           any `json:"ipBlock"`
			}
			Ports []struct{ Port any }
		}
	}](t, m.get(t, "NetworkPolicy", "sluice"))
	if len(np.PodSelector.MatchLabels) == 0 || !selects(np.PodSelector.MatchLabels, podLabels) {
		t.Errorf("NetworkPolicy selects %v, not the pods %v", np.PodSelector.MatchLabels, podLabels)
	}
	if !slices.Contains(np.PolicyTypes, "Ingress") {
		t.Errorf("NetworkPolicy policyTypes %v: want Ingress", np.PolicyTypes)
	}
	publicFromAnywhere, adminFromMonitoring := false, false
	for i, rule := range np.Ingress {
		if len(rule.Ports) == 0 {
			t.Errorf("NetworkPolicy ingress rule %d admits every port", i)
		}
		for _, p := range rule.Ports {
			switch resolvePort(p.Port, ports) {
			case ports["http"]:
				publicFromAnywhere = publicFromAnywhere || len(rule.From) == 0
			case ports["admin"]:
				for _, f := range rule.From {
					onlyMonitoring := f.NamespaceSelector != nil && f.PodSelector == nil && f.IPBlock == nil &&
						len(f.NamespaceSelector.MatchLabels) == 1 && f.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] == "monitoring"
					if !onlyMonitoring {
						t.Errorf("NetworkPolicy admits the admin port from %+v: want only the monitoring namespace", f)
					}
				}
				if len(rule.From) == 0 {
					t.Error("NetworkPolicy admits the admin port from anywhere")
				} else {
					adminFromMonitoring = true
				}
			default:
				t.Errorf("NetworkPolicy admits port %v, which is neither public nor admin", p.Port)
			}
		}
	}
	if !publicFromAnywhere || !adminFromMonitoring {
		t.Errorf("NetworkPolicy: public port from anywhere %v, admin port from monitoring %v; want both", publicFromAnywhere, adminFromMonitoring)
	}
}

// checkConfig runs `sluice check-config` with the pod's configuration:
// the rules file, the ConfigMap's settings, the literal env values, and
// placeholders for what the Secret holds.
func checkConfig(t *testing.T, rules string, configEnv, literal map[string]string) {
	t.Helper()
	dir := t.TempDir()
	file := filepath.Join(dir, "rules.conf")
	if err := os.WriteFile(file, []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"SLUICE_HASH_KEY=placeholder-hash-key-0123456789",
		"SLUICE_ADMIN_TOKEN=placeholder-admin-token",
		"SLUICE_DATABASE_URL=postgres://sluice@db.example.com:5432/sluice",
	}
	for _, src := range []map[string]string{configEnv, literal} {
		for k, v := range src {
			if strings.HasPrefix(k, "SLUICE_") {
				env = append(env, k+"="+v)
			}
		}
	}
	env = append(env, "SLUICE_RULES_FILE="+file)
	if out, err := proctest.Run("", env, sluiceBinary(t), "check-config"); err != nil {
		t.Errorf("sluice check-config with the pod's configuration: %v\n%s", err, out)
	}
}

// literalEnv returns the container's environment variables that have
// literal values.
func literalEnv(c container) map[string]string {
	env := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			env[e.Name] = e.Value
		}
	}
	return env
}

// listenPort returns the port of a host:port address, 0 if none.
func listenPort(t *testing.T, addr string) int {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(port)
	return n
}

// resolvePort returns the container port a number or a port name refers
// to, or 0.
func resolvePort(p any, ports map[string]int) int {
	switch p := p.(type) {
	case float64:
		for _, n := range ports {
			if n == int(p) {
				return n
			}
		}
	case string:
		return ports[p]
	}
	return 0
}

// selects reports whether selector matches labels.
func selects(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// checkSecretsDocumented checks that docs/deploy.md tells how to create every
// Secret key the manifests refer to (name/key by what uses it): the
// Secrets themselves are never committed.
func checkSecretsDocumented(t *testing.T, refs map[string]string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "docs", "deploy.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	for what, ref := range refs {
		name, key, _ := strings.Cut(ref, "/")
		i := strings.Index(readme, "kubectl -n sluice create secret generic "+name+" ")
		if i < 0 {
			t.Errorf("%s comes from Secret %s, which docs/deploy.md does not say how to create", what, name)
			continue
		}
		command, _, _ := strings.Cut(readme[i:], "\nkubectl")
		if !strings.Contains(command, "--from-literal="+key+"=") {
			t.Errorf("%s comes from key %s of Secret %s, which docs/deploy.md's command does not create", what, key, name)
		}
	}
}

// TestKubernetesPostgres renders the CloudNativePG example and checks what
// its comments and docs/deploy.md promise: one Cluster, in sluice's namespace,
// whose commits wait for any one of its standbys and never go on without
// one, with a standby to spare so that losing one stops no commit; no
// parameter that would undo that; and docs/deploy.md pointing sluice at the
// Service of its primary.
func TestKubernetesPostgres(t *testing.T) {
	t.Parallel()
	m := decodeManifests(t, kustomize(t, filepath.Join(root, "deploy", "kubernetes", "postgres")))
	if len(m) != 1 {
		t.Errorf("rendered %d objects, want one Cluster", len(m))
	}
	o := m.get(t, "Cluster", "sluice-db")
	if o.APIVersion != "postgresql.cnpg.io/v1" || o.Metadata.Namespace != "sluice" {
		t.Errorf("Cluster sluice-db: apiVersion %q, namespace %q; want postgresql.cnpg.io/v1 in sluice", o.APIVersion, o.Metadata.Namespace)
	}
	c := spec[struct {
		Instances       int
		MinSyncReplicas *int `json:"minSyncReplicas"`
		MaxSyncReplicas *int `json:"maxSyncReplicas"`
		Postgresql      struct {
			Parameters  map[string]string
			Synchronous *struct {
				Method         string
				Number         int
				DataDurability string `json:"dataDurability"`
			}
		}
	}](t, o)
	sync := c.Postgresql.Synchronous
	switch {
	case sync == nil:
		t.Fatal("no spec.postgresql.synchronous: commits would not wait for a standby")
	case sync.Method != "any" || sync.Number < 1:
		t.Errorf("synchronous %+v: want method any, number 1 or more", *sync)
	case sync.DataDurability != "" && sync.DataDurability != "required":
		t.Errorf("synchronous dataDurability %q: with preferred, commits go on without a standby and a failover can lose them", sync.DataDurability)
	case c.Instances-1 <= sync.Number:
		t.Errorf("%d instances for %d synchronous standbys: want a standby more, so that losing one stops no commit", c.Instances, sync.Number)
	}
	if c.MinSyncReplicas != nil || c.MaxSyncReplicas != nil {
		t.Error("minSyncReplicas or maxSyncReplicas beside the synchronous stanza: the operator takes one or the other")
	}
	for _, k := range []string{"synchronous_standby_names", "synchronous_commit"} {
		if v, ok := c.Postgresql.Parameters[k]; ok {
			t.Errorf("parameter %s = %q: the synchronous stanza and the server's default decide it", k, v)
		}
	}
	readme, err := os.ReadFile(filepath.Join(root, "docs", "deploy.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "@sluice-db-rw:5432/") {
		t.Error("docs/deploy.md does not point sluice's database URL at the Service sluice-db-rw")
	}
}

// kubernetesFiles is every file under deploy/kubernetes: each is a
// kustomization or something one of them uses, so TestKubernetes and
// TestKubernetesPostgres render all of them.
var kubernetesFiles = []string{
	"deploy/kubernetes/kustomization.yaml",
	"deploy/kubernetes/base/kustomization.yaml",
	"deploy/kubernetes/base/config.env",
	"deploy/kubernetes/base/deployment.yaml",
	"deploy/kubernetes/base/horizontalpodautoscaler.yaml",
	"deploy/kubernetes/base/migrate-job.yaml",
	"deploy/kubernetes/base/networkpolicy.yaml",
	"deploy/kubernetes/base/poddisruptionbudget.yaml",
	"deploy/kubernetes/base/rules.conf",
	"deploy/kubernetes/base/service.yaml",
	"deploy/kubernetes/base/serviceaccount.yaml",
	"deploy/kubernetes/overlays/example/kustomization.yaml",
	"deploy/kubernetes/overlays/example/namespace.yaml",
	"deploy/kubernetes/overlays/example/rules.conf",
	"deploy/kubernetes/postgres/kustomization.yaml",
	"deploy/kubernetes/postgres/cloudnativepg.yaml",
}

// TestKubernetesFiles: the files under deploy/kubernetes are exactly
// kubernetesFiles, and every one that is not a kustomization is named by
// the kustomization of its directory (a resource, or a generator's file or
// env file): a manifest added without being listed would never be
// rendered, nor checked.
func TestKubernetesFiles(t *testing.T) {
	var found []string
	err := filepath.WalkDir(filepath.Join(root, "deploy", "kubernetes"), func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(root, path)
			found = append(found, filepath.ToSlash(rel))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	want := slices.Sorted(slices.Values(kubernetesFiles))
	if slices.Sort(found); !slices.Equal(found, want) {
		t.Fatalf("files under deploy/kubernetes:\n%v\nwant (kubernetesFiles):\n%v", found, want)
	}
	named := map[string]bool{}
	for _, f := range kubernetesFiles {
		if filepath.Base(f) != "kustomization.yaml" {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		var k struct {
			Resources          []string
			ConfigMapGenerator []struct{ Files, Envs []string } `json:"configMapGenerator"`
		}
		if err := yaml.Unmarshal(raw, &k); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		refs := k.Resources
		for _, g := range k.ConfigMapGenerator {
			refs = append(refs, g.Files...)
			refs = append(refs, g.Envs...)
		}
		for _, r := range refs {
			named[filepath.ToSlash(filepath.Join(filepath.Dir(f), r))] = true
		}
	}
	for _, f := range kubernetesFiles {
		if filepath.Base(f) != "kustomization.yaml" && !named[f] {
			t.Errorf("%s is named by no kustomization: it is never rendered", f)
		}
	}
}
