#!/usr/bin/env bash
# Packs the sources that tiny-cuda-nn's native sample `mlp_learning_an_image` needs into one small archive,
# .tcnn/tcnn-src.tar.xz of the repository root, for benchmarks/tools/tcnn_native.py to build on a machine
# without network access (carry ".tcnn" there).
#
#     benchmarks/tools/tcnn_sources.sh [TCNN_GIT CUTLASS_GIT FMT_GIT CMRC_GIT]
#
# Each argument is a git directory (bare or not) holding the pinned commit below; the defaults are the
# mirrors under /work/.mirror. Only what the sample's build reads is kept: tiny-cuda-nn's library,
# sample and header-only dependencies; CUTLASS's headers (include/, tools/util/include/) and the
# CMakeLists.txt whose presence tiny-cuda-nn's CMakeLists checks; {fmt}'s library sources, CMake
# helpers and the two text files its CMakeLists lists among the library's sources; CMakeRC's single
# CMake module. Documentation, tests, examples, images and Python bindings are left out. The archive's
# COMMITS file names the commit of each part.
set -euo pipefail

TCNN_COMMIT=6ee3546bda615f51abe684ce9edefeb414689135
CUTLASS_COMMIT=82f5075946e2569589439d500733b700a3141374
FMT_COMMIT=fa2eb2d2e3ec5c21629f8ccd88ae05ec40b963fa
CMRC_COMMIT=952ffddba731fc110bd50409e8d2b8a06abbd237

mirror=/work/.mirror
tcnn_git=${1:-$mirror/NVlabs+tiny-cuda-nn/repo}
cutlass_git=${2:-$mirror/NVIDIA+cutlass/repo}
fmt_git=${3:-$mirror/fmtlib+fmt/repo}
cmrc_git=${4:-$mirror/vector-of-bool+cmrc/repo}

root=$(git rev-parse --show-toplevel)
out_dir="$root/.tcnn"
archive="$out_dir/tcnn-src.tar.xz"

need_commit() {  # git dir, commit
    if ! git -C "$1" cat-file -e "$2^{commit}" 2>/dev/null; then
        echo "error: $1 lacks commit $2 (fetch that repository first)" >&2
        exit 1
    fi
}
need_commit "$tcnn_git" "$TCNN_COMMIT"
need_commit "$cutlass_git" "$CUTLASS_COMMIT"
need_commit "$fmt_git" "$FMT_COMMIT"
need_commit "$cmrc_git" "$CMRC_COMMIT"

# The submodule pointers of the pinned tiny-cuda-nn commit must be the commits packed here.
submodule_commit() { git -C "$tcnn_git" ls-tree "$TCNN_COMMIT" "dependencies/$1" | awk '{print $3}'; }
for pair in "cutlass $CUTLASS_COMMIT" "fmt $FMT_COMMIT" "cmrc $CMRC_COMMIT"; do
    set -- $pair
    if [ "$(submodule_commit "$1")" != "$2" ]; then
        echo "error: tiny-cuda-nn $TCNN_COMMIT points dependencies/$1 at $(submodule_commit "$1"), not $2" >&2
        exit 1
    fi
done

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
top="$stage/tiny-cuda-nn"
mkdir -p "$top/dependencies/cutlass" "$top/dependencies/fmt" "$top/dependencies/cmrc"

# git dir, commit, destination, paths... A mirror that lacks some large blobs (images) makes git archive
# print "invalid object" for them even when they lie outside the paths asked for; it still exports those
# paths completely and exits with 0, and any other failure stops this script (pipefail).
export_paths() {
    local git_dir=$1 commit=$2 dest=$3
    shift 3
    git -C "$git_dir" archive --format=tar "$commit" -- "$@" | tar -x -C "$dest"
}

export_paths "$tcnn_git" "$TCNN_COMMIT" "$top" \
    CMakeLists.txt LICENSE.txt include src samples/CMakeLists.txt samples/mlp_learning_an_image.cu \
    dependencies/json dependencies/pcg32 dependencies/stbi data/config_hash.json
export_paths "$cutlass_git" "$CUTLASS_COMMIT" "$top/dependencies/cutlass" \
    CMakeLists.txt LICENSE.txt include tools/util/include
export_paths "$fmt_git" "$FMT_COMMIT" "$top/dependencies/fmt" \
    CMakeLists.txt LICENSE.rst README.rst ChangeLog.rst include src support/cmake
export_paths "$cmrc_git" "$CMRC_COMMIT" "$top/dependencies/cmrc" \
    CMakeRC.cmake LICENSE.txt

printf 'tiny-cuda-nn %s\ncutlass %s\nfmt %s\ncmrc %s\n' \
    "$TCNN_COMMIT" "$CUTLASS_COMMIT" "$FMT_COMMIT" "$CMRC_COMMIT" > "$top/COMMITS"

mkdir -p "$out_dir"
# Fixed order, times and owners: the same commits give the same archive.
tar -C "$stage" --sort=name --mtime='2000-01-01 00:00:00Z' --owner=0 --group=0 --numeric-owner \
    -cf - tiny-cuda-nn | xz -9e -T1 > "$archive.part"
mv "$archive.part" "$archive"

echo "$archive: $(stat -c %s "$archive") bytes, $(tar -tJf "$archive" | grep -vc '/$') files"
