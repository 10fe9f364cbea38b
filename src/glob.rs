//! Name globs, as config writes them for model names (`allowed_models`) and header names
//! (`pass_headers`): `*` any run, `?` one byte, everything else literal; matched whole.

/// `*` any run, `?` one byte; everything else literal.
pub fn matches(glob: &[u8], name: &[u8]) -> bool {
    let (mut g, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        match glob.get(g) {
            Some(b'*') => {
                star = Some((g, n));
                g += 1;
            }
            Some(&c) if c == b'?' || c == name[n] => {
                g += 1;
                n += 1;
            }
            _ => match star {
                Some((sg, sn)) => {
                    g = sg + 1;
                    n = sn + 1;
                    star = Some((sg, sn + 1));
                }
                None => return false,
            },
        }
    }
    glob[g..].iter().all(|&c| c == b'*')
}
