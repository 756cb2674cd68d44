#!/usr/bin/env bash
# Print the shared-library dependencies of the staged package ROOT (the ${shlibs:Depends}
# of a debhelper build), from dpkg-shlibdeps over every ELF file in it. The wheels' own
# copies of libraries (numpy.libs/, av.libs/, ...) are found inside ROOT with -l; what
# remains comes from the distribution (libc6, libstdc++6, libsystemd0, zlib1g, ...).
set -euo pipefail
ROOT=$1
elfs=()
while IFS= read -r -d '' file; do
  [ "$(head -c 4 "$file" | od -An -c | tr -d ' ')" = '177ELF' ] && elfs+=("$file")
done < <(find "$ROOT" -path "$ROOT/DEBIAN" -prune -o -type f -name '*.so*' -print0 | LC_ALL=C sort -z)
((${#elfs[@]})) || exit 0
libdirs=()
while IFS= read -r dir; do libdirs+=("-l$dir"); done < <(printf '%s\n' "${elfs[@]}" | xargs -n1 dirname | LC_ALL=C sort -u)
# dpkg-shlibdeps reads debian/control for the package's name: a throwaway one.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir "$scratch/debian"
printf 'Source: edge-agent\n\nPackage: edge-agent\nArchitecture: any\n' >"$scratch/debian/control"
if ! (cd "$scratch" && dpkg-shlibdeps -O --ignore-missing-info "${libdirs[@]}" "${elfs[@]}") \
  >"$scratch/out" 2>"$scratch/err"; then
  cat "$scratch/err" >&2
  exit 1
fi
sed -n 's/^shlibs:Depends=//p' "$scratch/out"
