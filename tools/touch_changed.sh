#!/bin/bash
# Before an incremental build in a kept build directory (a warm GPU machine keeps /tmp between
# calls): the working tree is copied there again for every call, and a copied file can carry an
# older modification time than the objects built from its previous version, so Ninja would not
# rebuild it (a stop-66 call timed the old kernel twice that way). This touches every source whose
# content differs from the last build's, by a checksum list kept in the build directory.
#   tools/touch_changed.sh BUILD_DIR      (from the repository root, before cmake --build)
set -u
B=$1; LIST=$B/.source-md5
mkdir -p "$B"
NOW=$(mktemp)
find src include python/src tests/cpp tests/common CMakeLists.txt -type f 2>/dev/null | sort | xargs md5sum > "$NOW"
if [ -f "$LIST" ]; then
  # Lines of NOW not in LIST: new or changed files.
  changed=$(comm -13 <(sort "$LIST") <(sort "$NOW") | awk '{print $2}')
  [ -n "$changed" ] && { echo "$changed" | xargs touch; echo "touch_changed: $(echo "$changed" | wc -l) changed source(s) touched"; }
fi
mv "$NOW" "$LIST"
