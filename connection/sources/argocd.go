package sources

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/fleetgraph/fleetgraph/connection"
)

// The Argo CD source's name and the label of Argo CD cluster Secrets.
const (
	ArgoCDSource = "argocd"
	// ArgoCDSecretTypeLabel marks Argo CD's declarative cluster Secrets
	// when its value is "cluster".
	ArgoCDSecretTypeLabel = "argocd.argoproj.io/secret-type"
)

// argoInCluster is the server Argo CD uses for the cluster it runs in.
const argoInCluster = "https://kubernetes.default.svc"

// argoConfig is the "config" field of an Argo CD cluster Secret (Argo CD's
// ClusterConfig), as far as a client config needs it.
type argoConfig struct {
	Username        string `json:"username,omitempty"`
	Password        string `json:"password,omitempty"`
	BearerToken     string `json:"bearerToken,omitempty"`
	TLSClientConfig struct {
		Insecure   bool   `json:"insecure,omitempty"`
		ServerName string `json:"serverName,omitempty"`
		CertData   []byte `json:"certData,omitempty"`
		KeyData    []byte `json:"keyData,omitempty"`
		CAData     []byte `json:"caData,omitempty"`
	} `json:"tlsClientConfig"`
	AWSAuthConfig      *json.RawMessage `json:"awsAuthConfig,omitempty"`
	ExecProviderConfig *struct {
		Command     string            `json:"command,omitempty"`
		Args        []string          `json:"args,omitempty"`
		Env         map[string]string `json:"env,omitempty"`
		APIVersion  string            `json:"apiVersion,omitempty"`
		InstallHint string            `json:"installHint,omitempty"`
	} `json:"execProviderConfig,omitempty"`
	DisableCompression bool   `json:"disableCompression,omitempty"`
	ProxyURL           string `json:"proxyUrl,omitempty"`
}

// NewArgoCD returns the source of Argo CD's declarative cluster Secrets
// (label argocd.argoproj.io/secret-type=cluster) in
// Options.ArgoCDNamespace. Each is a cluster named by its "name" field,
// with the Secret's labels, reached at "server" with the credentials of
// "config": a bearer token, basic auth, TLS client certificates and CA, or
// an exec provider. The in-cluster server with no credentials is the
// management cluster, reached as fleetgraph reaches it.
func NewArgoCD(opts Options) Source { return &argoSource{opts: opts} }

type argoSource struct{ opts Options }

func (s *argoSource) Name() string { return ArgoCDSource }

func (s *argoSource) Run(ctx context.Context, r *Registry) error {
	c, err := newClients(s.opts.Management)
	if err != nil {
		return err
	}
	ns := s.opts.ArgoCDNamespace
	if ns == "" {
		ns = DefaultArgoCDNamespace
	}
	w := newWatcher(ArgoCDSource, r, logger(s.opts.Logger))
	inf := labelledSecrets(c, ns, ArgoCDSecretTypeLabel+"=cluster")
	if err := w.add(inf); err != nil {
		return err
	}
	return w.run(ctx, func() []Claim {
		var out []Claim
		for _, obj := range inf.GetStore().List() {
			if sec, ok := obj.(*corev1.Secret); ok {
				out = append(out, argoClaim(sec, c.cfg))
			}
		}
		return out
	})
}

func argoClaim(sec *corev1.Secret, management *rest.Config) Claim {
	ref := objectRef(sec)
	name := string(sec.Data["name"])
	if name == "" {
		name = sec.Name
	}
	c := Claim{
		Object: ref, Cluster: clusterName(sec, name),
		Labels:  clusterLabels(ArgoCDSource, sec, ArgoCDSecretTypeLabel),
		Version: string(sec.UID) + "/" + sec.ResourceVersion,
	}
	cfg, err := argoRESTConfig(sec, management)
	if err != nil {
		c.Config = failing(fmt.Errorf("argo CD cluster secret %s: %w", ref, err))
		return c
	}
	c.Config = func(context.Context) (*rest.Config, error) { return rest.CopyConfig(cfg), nil }
	return c
}

// argoRESTConfig builds the client config an Argo CD cluster Secret
// describes.
func argoRESTConfig(sec *corev1.Secret, management *rest.Config) (*rest.Config, error) {
	server := strings.TrimSpace(string(sec.Data["server"]))
	if server == "" {
		return nil, errors.New(`no "server" field`)
	}
	u, err := url.Parse(server)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return nil, fmt.Errorf("server %q is not an http(s) URL", server)
	}
	var ac argoConfig
	if raw := sec.Data["config"]; len(raw) > 0 {
		if err := json.Unmarshal(raw, &ac); err != nil {
			return nil, fmt.Errorf(`"config" field: %w`, err)
		}
	}
	if ac.AWSAuthConfig != nil {
		return nil, errors.New(`"config" uses awsAuthConfig, which needs Argo CD's own argocd-k8s-auth; use execProviderConfig (for example aws eks get-token) instead`)
	}
	tls := ac.TLSClientConfig
	noCredentials := ac.BearerToken == "" && ac.Username == "" && ac.ExecProviderConfig == nil && len(tls.CertData) == 0
	if strings.TrimSuffix(server, "/") == argoInCluster && noCredentials {
		return rest.CopyConfig(management), nil // Argo CD's in-cluster entry: the management cluster
	}
	cfg := &rest.Config{
		Host:        server,
		BearerToken: ac.BearerToken,
		Username:    ac.Username, Password: ac.Password,
		TLSClientConfig: rest.TLSClientConfig{
			Insecure: tls.Insecure, ServerName: tls.ServerName,
			CertData: tls.CertData, KeyData: tls.KeyData, CAData: tls.CAData,
		},
		DisableCompression: ac.DisableCompression,
	}
	if err := connection.CheckCA(cfg); err != nil {
		return nil, fmt.Errorf(`"config" tlsClientConfig.caData: %w`, err)
	}
	if (len(tls.CertData) > 0) != (len(tls.KeyData) > 0) {
		return nil, errors.New(`"config" tlsClientConfig needs both certData and keyData`)
	}
	if ac.ProxyURL != "" {
		p, err := url.Parse(ac.ProxyURL)
		if err != nil {
			return nil, fmt.Errorf(`"config" proxyUrl: %w`, err)
		}
		cfg.Proxy = func(*http.Request) (*url.URL, error) { return p, nil }
	}
	if e := ac.ExecProviderConfig; e != nil {
		if e.Command == "" {
			return nil, errors.New(`"config" execProviderConfig has no command`)
		}
		exec := &clientcmdapi.ExecConfig{
			Command: e.Command, Args: e.Args, APIVersion: e.APIVersion, InstallHint: e.InstallHint,
			InteractiveMode: clientcmdapi.NeverExecInteractiveMode,
		}
		for _, k := range slices.Sorted(maps.Keys(e.Env)) {
			exec.Env = append(exec.Env, clientcmdapi.ExecEnvVar{Name: k, Value: e.Env[k]})
		}
		cfg.ExecProvider = exec
	}
	return cfg, nil
}
