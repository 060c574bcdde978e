package testcluster

import (
	"context"
	"fmt"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// ServiceAccountToken issues a token for a ServiceAccount through the
// TokenRequest API, creating the ServiceAccount if it is missing. The token
// is bound to a Secret named bound, which it creates: deleting that Secret
// revokes the token at once, as rotating a credential would. It uses the
// direct connection.
func (c *Cluster) ServiceAccountToken(ctx context.Context, namespace, serviceAccount, bound string) (string, error) {
	kube, err := kubernetes.NewForConfig(c.DirectConfig)
	if err != nil {
		return "", fmt.Errorf("client: %w", err)
	}
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("create namespace %s: %w", namespace, err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: serviceAccount, Namespace: namespace}}
	if _, err := kube.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("create service account %s/%s: %w", namespace, serviceAccount, err)
	}
	sec, err := kube.CoreV1().Secrets(namespace).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: bound, Namespace: namespace}}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("create token binding secret %s/%s: %w", namespace, bound, err)
	}
	expiry := int64(3600)
	tr, err := kube.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, serviceAccount, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: &expiry,
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Secret", APIVersion: "v1", Name: sec.Name, UID: sec.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("request token for %s/%s: %w", namespace, serviceAccount, err)
	}
	return tr.Status.Token, nil
}

// RevokeToken deletes the Secret a token of ServiceAccountToken is bound
// to, which makes the API server refuse the token from then on.
func (c *Cluster) RevokeToken(ctx context.Context, namespace, bound string) error {
	kube, err := kubernetes.NewForConfig(c.DirectConfig)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	if err := kube.CoreV1().Secrets(namespace).Delete(ctx, bound, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("delete token binding secret %s/%s: %w", namespace, bound, err)
	}
	return nil
}

// TokenConfig returns a client config for a bearer token, through the
// proxy.
func (c *Cluster) TokenConfig(token string) *rest.Config {
	cfg := c.configFor(AdminUser, c.Proxy.URL())
	cfg.BearerToken = token
	return cfg
}

// KubeconfigForToken returns a kubeconfig with one context, named after the
// cluster, that authenticates with a bearer token, through the proxy.
func (c *Cluster) KubeconfigForToken(token string) *clientcmdapi.Config {
	cfg := c.KubeconfigFor(AdminUser)
	cfg.AuthInfos = map[string]*clientcmdapi.AuthInfo{c.Name + "-token": {Token: token}}
	cfg.Contexts[c.Name].AuthInfo = c.Name + "-token"
	return cfg
}
